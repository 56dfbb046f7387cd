"""The one error type for problems of the user's making.

A bad config value, a missing or unreadable data folder, a workdir holding another run, an example too long for
max_len: these raise `UserError`, and the entry points turn it into one line on stderr and a non-zero exit. Any
other exception is a bug (ours, or a library's) and keeps its traceback.

It subclasses ValueError, so code that already catches ValueError around a user-facing check keeps working.
"""


class UserError(ValueError):
  """A problem the user can fix: the message names what to change."""
