"""data/uri: which paths are remote, an epath for one, one line for a missing filesystem."""

import pytest

from electra_jax.data import DataError, uri


def test_a_scheme_makes_a_path_remote():
    assert uri.uri_scheme("gs://bucket/corpus/*.txt") == "gs"
    assert uri.uri_scheme("s3+x://b/k") == "s3+x"
    for local in ("corpus/*.txt", "/abs/path", "C:/data", "./gs:/x", "", "1gs://x"):
        assert uri.uri_scheme(local) is None, local


def test_a_remote_path_is_an_epath_and_an_unknown_scheme_is_one_line():
    epath = pytest.importorskip("etils.epath")
    assert isinstance(uri.remote_path("gs://bucket/x.txt", "data.source"), epath.Path)
    with pytest.raises(DataError) as e:
        uri.remote_path("http://example.com/x.txt", "data.tokenizer")
    message = str(e.value)
    assert message.startswith("data.tokenizer: http://example.com/x.txt has scheme http://")
    assert "gs://, s3://" in message and "\n" not in message


def test_a_missing_filesystem_package_is_named_with_its_install_command():
    s3 = r"data.source: reading s3://b/x needs s3fs, .* install s3fs"
    with pytest.raises(DataError, match=s3), uri.remote_errors("s3://b/x", "data.source"):
        raise ImportError("No module named 's3fs'")
    gs = r"needs gcsfs \(or tensorflow\)"
    with pytest.raises(DataError, match=gs), uri.remote_errors("gs://b/x", "data.source"):
        raise ImportError("No module named 'gcsfs'")
    with uri.remote_errors("gs://b/x", "data.source"):
        pass  # nothing raised: nothing said
