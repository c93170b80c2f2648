"""fastai.callback.core.Callback as fastai 2.x documents it, written from that description for the tests.

A callback has an order, run/run_train/run_valid flags, is called with the
name of an event and runs its method of that name (inner-loop events only
in the mode its flags allow), reads the learner's attributes it lacks, and
warns when it sets a name the learner already has.
"""

import warnings

_INNER_LOOP = frozenset({
    "before_batch", "after_pred", "after_loss", "before_backward", "after_cancel_backward", "after_backward",
    "before_step", "after_cancel_step", "after_step", "after_cancel_batch", "after_batch",
})


class Callback:
    order, learn, run, run_train, run_valid = 0, None, True, True, True

    def __init__(self, **kwargs):
        assert not kwargs, f"passed unknown arguments {kwargs}"

    def __call__(self, event_name):
        training = getattr(self, "training", True)
        runs = (event_name not in _INNER_LOOP or (self.run_train and training) or (self.run_valid and not training))
        res = None
        if self.run and runs:
            method = getattr(self, event_name, None)
            if callable(method):
                res = method()
        if event_name == "after_fit":
            self.run = True
        return res

    def __getattr__(self, name):
        if name.startswith("_") or name == "learn" or self.learn is None:
            raise AttributeError(name)
        return getattr(self.learn, name)

    def __setattr__(self, name, value):
        learn = self.__dict__.get("learn", type(self).learn)
        if name != "learn" and learn is not None and hasattr(learn, name):
            warnings.warn(f"shadowing the learner's attribute {name}")
        super().__setattr__(name, value)
