"""What a fit raises where its rows are too few for it.

`finetwin calibrate` says it and stops; a comparison's fit on the training part of its split, which holds
fewer rows than the version itself was fitted on, leaves the held-out metrics unmeasured instead of failing
the calibration (`calibrate.promotion`)."""

from __future__ import annotations


class TooFewRuns(ValueError):
    """Too few valid runs or runtime failures to fit a model: says how many it needs and how many it got."""
