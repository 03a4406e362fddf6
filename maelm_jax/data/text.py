"""Text as the corpora and the tokenizer both read it: lines split at "\n" only, and
the bad-text rule (what is UTF-8 text, what is skipped or refused)."""


def text_lines(text: str) -> list[str]:
  """Lines split at "\n" only (a trailing "\r" dropped): JSON Lines' record
  separator and every text file's. `str.splitlines()` also breaks at U+0085,
  U+2028, U+2029, \x0b, \x0c and \x1c-\x1e, which real text carries inside
  its records (656 IMDB reviews hold U+0085, a mis-decoded ellipsis)."""
  lines = text.split("\n")
  if lines and not lines[-1]:
    lines.pop()
  return [line[:-1] if line.endswith("\r") else line for line in lines]


# A file whose share of bytes that are not UTF-8 is above this is not text (a
# binary file, or another encoding); under it, they are replaced by U+FFFD.
NOT_TEXT_FRACTION = 0.01


class NotText(Exception):
  """The bytes are not UTF-8 text; the message says why and where first."""


class Utf8Reader:
  """The bad-text rule, one home for a file read whole (`sources`) and one read
  line by line (`prepare_data`): feed the bytes in order with `decode`, then ask
  `check`.

  A NUL byte ends the file at once (`NotText`): text has none. Bytes that are not
  UTF-8 become U+FFFD and are counted; over `NOT_TEXT_FRACTION` of all bytes the
  file is not text, under it the replacements are worth a warning (`warning`).
  """

  def __init__(self, path: str):
    self.path = path
    self.bad = self.total = 0
    self.first_bad_line: int | None = None

  def decode(self, chunk: bytes, first_line: int = 1) -> str:
    """`chunk` (whole lines, the first of them numbered `first_line`) as text."""
    self.total += len(chunk)
    if b"\x00" in chunk:
      line = first_line + chunk.count(b"\n", 0, chunk.index(b"\x00"))
      raise NotText(f"it holds NUL bytes, the first at line {line}")
    try:
      return chunk.decode("utf-8")
    except UnicodeDecodeError as error:
      if self.first_bad_line is None:
        self.first_bad_line = first_line + chunk.count(b"\n", 0, error.start)
      text = chunk.decode("utf-8", errors="replace")
      self.bad += text.count("\ufffd") - chunk.decode("utf-8", errors="ignore").count(
          "\ufffd")
      return text

  def check(self) -> None:
    """Raises `NotText` if too many bytes were not UTF-8."""
    if self.bad > NOT_TEXT_FRACTION * self.total:
      raise NotText(f"{self.bad} of its {self.total} bytes are not UTF-8, the first "
                    f"at line {self.first_bad_line}")

  def warning(self, refuse_hint: str) -> str | None:
    """The warning for a file whose few bad bytes were replaced (None if none);
    `refuse_hint` names the flag that makes them an error."""
    if not self.bad:
      return None
    return (f"{self.path}, line {self.first_bad_line}: {self.bad} byte(s) are not "
            "UTF-8 and were replaced by U+FFFD (latin-1 text? convert it with iconv "
            f"-f latin1 -t utf-8){refuse_hint}")


def not_text_message(path: str, reason: str, flag: str) -> str:
  """The one-line refusal of a file that is not text (`reason`: NotText's)."""
  return (f"{path} is not UTF-8 text ({reason}): a binary file or another encoding; "
          f"convert it (e.g. iconv -f latin1 -t utf-8) or leave it out of {flag}")
