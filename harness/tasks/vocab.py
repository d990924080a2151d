"""The token vocabulary of the generated tasks, shared with the local backend's model
(``harness.backends.local.model`` reads ``VOCAB_SIZE`` from here): the digits 0-9 are their own ids.
``CALL_END`` ends a tool call (the first policy turn of a multi-turn task, ``harness/tasks/lookup.py``)."""

DIGITS = tuple(str(d) for d in range(10))
PLUS, EQUALS, BOS, EOS, PAD, CALL_END = 10, 11, 12, 13, 14, 15
VOCAB_SIZE = 16
