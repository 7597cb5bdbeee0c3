"""URIs (gs://, s3://, ...) as the data path and the config checks see them: which paths are
remote, an ``etils.epath`` path for one, and one error line for a missing filesystem package.

A leaf of ``data/``: the corpus reader (sources.py), the tokenizer files (tokenizer.py), the
prepared cache (prepare.py) and ``validate.py`` ask it, without importing the corpus reader.
"""

from __future__ import annotations

import contextlib
import re

from electra_jax.data import DataError

# A path with a scheme (gs://bucket/x) is remote; anything else is a local path and keeps the
# os/glob code path of the readers untouched.
_URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The schemes etils.epath reads, and the package its fsspec backend needs for each. For gs://,
# epath uses TensorFlow's gfile instead when tensorflow is installed.
REMOTE_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}


def uri_scheme(path: str) -> str | None:
    """The scheme of a URI (``'gs'`` for ``gs://bucket/x``); None for a local path."""
    match = _URI_RE.match(path)
    return match.group(1) if match else None


def remote_path(path: str, what: str):
    """An ``etils.epath.Path`` for a remote URI.

    Args:
      path: e.g. ``gs://bucket/dir/file``.
      what: the config field it came from, for messages (e.g. ``data.tokenizer``).

    Raises:
      DataError: a scheme etils.epath does not read, or etils itself missing.
    """
    scheme = uri_scheme(path)
    if scheme not in REMOTE_PACKAGES:
        schemes = ", ".join(f"{s}://" for s in REMOTE_PACKAGES)
        raise DataError(
            f"{what}: {path} has scheme {scheme}://, which cannot be read; use a local or "
            f"mounted path, or one of {schemes}"
        )
    try:
        from etils import epath
    except ImportError:
        raise DataError(
            f"{what}: reading {path} needs etils.epath: pip install 'etils[epath]'"
        ) from None
    return epath.Path(path)


@contextlib.contextmanager
def remote_errors(path: str, what: str):
    """Turns a missing filesystem backend into one DataError line naming the package.

    etils.epath reaches gs:// through fsspec, which imports gcsfs (s3fs, ...) at the first call
    and raises ImportError when it is not installed.
    """
    try:
        yield
    except ImportError as e:
        package = REMOTE_PACKAGES.get(uri_scheme(path) or "", "")
        alternative = " (or tensorflow)" if package == "gcsfs" else ""
        raise DataError(
            f"{what}: reading {path} needs {package}{alternative}, which is not installed "
            f"({e}): pip install {package}"
        ) from None
