"""Every command refuses the same bad numbers with the same message."""

from __future__ import annotations

import pytest

from wrapper.cli import build_parser


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["wrap", "--restart-delay", "inf", "--", "pi"], "inf is not a non-negative number"),
        (["wrap", "--restart-delay", "-1", "--", "pi"], "-1 is not a non-negative number"),
        (["wrap", "--max-restarts", "2.5", "--", "pi"], "2.5 is not a whole number >= 0"),
        (["metrics", "--textfile", "x.prom", "--interval", "0"], "0 is not a positive number of seconds"),
        (["watch", "--exec-timeout", "nan"], "nan is not a positive number of seconds"),
        (["watch", "--headroom", "-5"], "-5 is not a whole number >= 0"),
        # A threshold at or below 0 would fire on every reading (issue 27).
        (["watch", "--at", "-5"], "-5 is not a percent above 0"),
        (["watch", "--at", "0"], "0 is not a percent above 0"),
        (["watch", "--at", "80,-0.5"], "-0.5 is not a percent above 0"),
        (["watch", "--at", "inf"], "'inf' is not a comma-separated list of percents"),
        # A negative duration reaches --since's own check, not argparse's "expected one argument".
        (["scan", "--since", "-1h"], "'-1h' is negative: how far back, like 30m, 2h or 7d"),
    ],
)
def test_a_bad_number_is_refused_with_one_message_everywhere(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_threshold_above_100_is_kept_and_says_only_an_overrun_reaches_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["watch", "--at", "95,150,100"])
    assert args.at == (95, 100, 150)
    err = capsys.readouterr().err
    assert "--at 150: above 100% only an overrun reaches, which pi, omp, opencode publish" in err
    assert "100," not in err  # 100 itself is reachable by every harness: no note for it
    build_parser().parse_args(["watch", "--at", "80,100"])
    assert capsys.readouterr().err == ""
