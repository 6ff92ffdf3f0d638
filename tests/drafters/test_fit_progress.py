"""Where a fit stands: every step to a front door's bar when one is drawn, else a line every 10 steps."""

from speclane.stages.fitting import fit


def test_progress_goes_to_the_bar_every_step_or_to_a_line_every_ten(capsys):
    s = fit.FitSettings(backend="mtp", corpus=["unused"], out="unused", steps=100)
    seen = []
    for step in (9, 10):
        fit.report(s, step, 1.5, 640, 2.0, lambda *a: seen.append(a))
    assert seen == [
        (9, 100, "fit mtp loss 1.500, 640 tokens, 2.00 steps/s"),
        (10, 100, "fit mtp loss 1.500, 640 tokens, 2.00 steps/s"),
    ]
    assert capsys.readouterr().err == ""
    fit.report(s, 9, 1.5, 640, 2.0)
    fit.report(s, 10, 1.5, 640, 2.0)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fit mtp [###") and "step 10/100" in lines[0]
