"""Workloads: trace files, the multi-candidate QA streams, the Figure 1 instance, datasets."""
