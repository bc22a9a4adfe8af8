"""Session set-up shared by every test: one temporary directory holds whatever the code under test
(and the libraries it drives) would write, and is removed when the session ends.

Set here, at import, before any test module imports radixflow, vLLM or matplotlib (and inherited by
the subprocesses tests start): the tiny-model cache (`RADIXFLOW_CACHE`, documented default
~/.cache/radixflow), vLLM's cache (`VLLM_CACHE_ROOT`: its modelinfos), matplotlib's config
(`MPLCONFIGDIR`), the XDG cache and config roots (Hugging Face and the like), triton's home, and the
temporary directory itself (pytest's tmp_path, `tempfile`): a user's own caches stay untouched.
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

SESSION_DIR = Path(tempfile.mkdtemp(prefix="radixflow-tests-"))
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)
_PLACES = {
    "RADIXFLOW_CACHE": "radixflow",
    "VLLM_CACHE_ROOT": "vllm",
    "MPLCONFIGDIR": "matplotlib",
    "XDG_CACHE_HOME": "cache",
    "XDG_CONFIG_HOME": "config",
    "TRITON_HOME": "triton",
    "TMPDIR": "tmp",
}
for _var, _sub in _PLACES.items():
    (SESSION_DIR / _sub).mkdir()
    os.environ[_var] = str(SESSION_DIR / _sub)
tempfile.tempdir = os.environ["TMPDIR"]  # this process too, not only its children
