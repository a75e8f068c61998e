"""The main job: `tdu demo` trains, crashes (SIGKILL), resumes in a new process and checks exactly-once."""

import os

import torch

from torch_dataloader_utils.cli import main
from torch_dataloader_utils.demo import check


def test_demo_end_to_end_and_its_checker(tmp_path, capfd):
    workdir = tmp_path / "demo"
    code = main(["demo", "--dir", str(workdir)])  # the two training runs are real child processes
    out, err = capfd.readouterr()
    assert code == 0, out + err
    assert "run 1 ended abruptly (killed by signal 9)" in out
    assert "every row seen exactly once: YES  (rows expected 40,000, seen 40,000, duplicated 0, lost 0)" in out
    assert "same order as an uninterrupted run: YES" in out
    assert "fresh start  (construction -> first batch)" in out and "resume       (load_state_dict -> first batch)" in out

    # the checkpoint really was taken part-way: some rows before the crash, the rest after the resume
    before = torch.load(workdir / "model.pt", weights_only=True)["seen_ids"]
    after = torch.load(workdir / "resume_result.pt", weights_only=True)["seen_ids"]
    assert 0 < len(before) < 40_000 and len(before) + len(after) == 40_000

    # the checker says NO when a row is delivered twice (this is what makes the demo exit 1)
    report = check(str(workdir), "parquet", 40_000)
    assert report.exactly_once and report.ok
    tampered = torch.load(workdir / "resume_result.pt", weights_only=True)
    tampered["seen_ids"] = torch.cat([tampered["seen_ids"], before[:1]])
    torch.save(tampered, workdir / "resume_result.pt")
    report = check(str(workdir), "parquet", 40_000)
    assert not report.exactly_once and (report.duplicated, report.lost) == (1, 0) and not report.same_order


def test_demo_refuses_a_non_empty_dir(tmp_path, capsys):
    (tmp_path / "something").write_text("x")
    assert main(["demo", "--dir", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["something"]
