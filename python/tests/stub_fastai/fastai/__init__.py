"""A stand-in fastai package, put on sys.path by test_fastai to run the callback's tests as where fastai is installed.

It holds only what fp16audit.fastai_callback imports: fastai.callback.core.Callback.
"""

__version__ = "2.7.0+stub"
