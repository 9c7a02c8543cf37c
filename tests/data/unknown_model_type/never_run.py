"""Code a config's auto_map names: shardplan must never import it (trust_remote_code=False). Importing
it leaves a marker file that tests/test_module_tree.py looks for."""
import os
from pathlib import Path

Path(os.environ.get("SHARDPLAN_NEVER_RUN_MARKER", "never_run.marker")).write_text("ran\n")
