"""Issue 12, fit --export FORMAT[=PATH] is checked before any evaluation (docs/errors.md)."""

import pytest

from tests.helpers import run_cli
from tests.test_bad_values import Q, one_line_error


# --- fit --export FORMAT[=PATH] is checked before the report ------------------------------------------
@pytest.mark.parametrize("target, named", [("bogus", "unknown format"), ("fsdp2={tmp}", "is a folder"),
                                           ("fsdp2={tmp}/afile/x.py", "is not a folder"),
                                           ("fsdp2={tmp}/" + "a" * 300 + ".py", "longer than the 255 bytes")])
def test_fit_export_target_is_checked_before_any_output(tmp_path, target, named):
    (tmp_path / "afile").write_text("x")
    res = run_cli("fit", Q, "--strategy", "full_shard", "--export", target.format(tmp=tmp_path))
    one_line_error(res, "export=", named)
    assert res.stdout == ""  # nothing evaluated or printed before the refusal


def test_fit_export_into_a_new_folder_still_writes(tmp_path):
    target = tmp_path / "new" / "train.py"  # the atomic writer creates missing folders
    res = run_cli("fit", Q, "--strategy", "full_shard", "--export", f"fsdp2={target}")
    assert res.exit_code == 0 and target.exists(), res.output
