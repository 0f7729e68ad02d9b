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
    ],
)
def test_a_bad_number_is_refused_with_one_message_everywhere(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
