"""The command line: argument parsing apart, and the demo end to end in-process."""

import pytest

from ackstream.cli import build_parser, main


def test_demo_arguments_and_env_default(monkeypatch):
    monkeypatch.setenv("ACKSTREAM_DEMO_ROOTS", "123")
    args = build_parser().parse_args(["demo", "--fail-every", "7"])
    assert (args.roots, args.fail_every) == (123, 7)


def test_bad_demo_argument_names_the_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--roots", "0"])
    assert stop.value.code == 2
    assert "--roots must be a positive number" in capsys.readouterr().err


@pytest.mark.spark
def test_demo_accounts_for_every_root(spark, tmp_path):
    from ackstream.demo import run_acker_demo

    lines = []
    summary = run_acker_demo(spark, roots=300, batches=3, fail_every=10, lose_every=7,
                             message_timeout_ms=1_500, directory=str(tmp_path),
                             progress=lines.append, timeout_s=120)
    assert summary.accounted_for, summary
    assert summary.acked + summary.failed + summary.timed_out == 300
    assert summary.failed == 30 and summary.timed_out == 300 // 7 - 300 // 70
    assert summary.p50_ms >= 0 and lines
