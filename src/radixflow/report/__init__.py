"""Paper-scale experiments and their report: cells, tables, figures, HTML (issue #5)."""
