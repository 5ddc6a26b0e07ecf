"""What a request gets when it names no strategy or decoder (torch-free: the command line's
options and the pipeline's tables name them without loading the engine).

A *strategy* is how the engine asks the model (``padellm``, ``ar``, ``fast_dllm``); a
*decoder* is how a :mod:`general_decoding` decoder produces the answers' tokens (``greedy``,
``copy``, ``anpd``, ...).
"""

DEFAULT_STRATEGY = "padellm"
#: The token decoder of mention (and AR) answers unless a call names one: copy drafting gives
#: greedy's tokens (lossless) in fewer forwards, since mentions are copied from the text.
DEFAULT_DECODER = "copy"
#: How many mentions past a count PaDeLLM may ask one after another, each while the model's
#: answer past the count is a new mention (:class:`StrategyOptions`): a count too low by more
#: than one, found by the model's own "no further mention" answer rather than a per-label bias.
PAST_COUNT_ROUNDS = 0
