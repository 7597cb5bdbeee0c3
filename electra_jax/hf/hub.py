"""`export --push_to_hub=REPO`: an export folder uploaded to the Hugging Face Hub.

What is uploaded is the export itself, as its export.json lists it (the model card, the networks'
files, export.json): nothing else a user keeps in the folder. The repository id and the token are
checked before the export is written, so that a typo or a missing login costs no restore; the
upload is one commit through huggingface_hub's `HfApi.upload_folder`, whose own retries and
large-file handling apply.
"""

from __future__ import annotations

import shlex

from electra_jax.errors import PretrainedError
from electra_jax.hf.previous import MANIFEST
from electra_jax.store import deadline
from electra_jax.store.jsonio import one_line

LOGIN = "log in with `hf auth login` or set HF_TOKEN"
# The stated deadline of the whole upload (the repository's creation and the commit), unless
# `export --hub_timeout_seconds` says otherwise: a Hub that accepts the connection and never
# answers ends the command within it, with the export kept in --out.
DEFAULT_TIMEOUT_SECONDS = 900.0


class HubTimeout(PretrainedError):
    """The Hub did not answer within the deadline; the upload is abandoned on its thread (the
    command ends the process at once, so that no library thread holds it up)."""


def check(repo: str) -> None:
    """PretrainedError (one line) for a repository id the Hub refuses ('NAME' or
    'NAMESPACE/NAME') or when no Hugging Face token is found; nothing is sent."""
    # huggingface_hub: only on the path that uses it (an optional extra, or slow to import).
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise PretrainedError(f"--push_to_hub={repo}: {one_line(e, 200)}") from None
    if not get_token():
        raise PretrainedError(f"--push_to_hub={repo} needs a Hugging Face token: {LOGIN}")


def push(
    out: str,
    repo: str,
    manifest: dict,
    private: bool = False,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> str:
    """Uploads the export in `out` (the files `manifest`, its export.json, lists) to the model
    repository `repo`, created if missing (`private` then), in one commit, within
    `timeout_seconds` in all; returns the commit's URL.

    Raises:
      HubTimeout: no end within the deadline (the export stays in `out`).
      PretrainedError: the Hub refused or could not be reached (the export stays in `out`).
    """
    # huggingface_hub: only on the path that uses it (an optional extra, or slow to import).
    from huggingface_hub import HfApi, constants

    api = HfApi()
    source = manifest.get("source", out)

    def upload():
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        return api.upload_folder(
            repo_id=repo,
            repo_type="model",
            folder_path=out,
            allow_patterns=[*manifest["files"], MANIFEST],
            commit_message=f"electra_jax export of {source}",
        )

    try:
        commit = deadline.call_within(timeout_seconds, upload)
    except deadline.DeadlinePassed:
        raise HubTimeout(
            f"the export is in {out}, but the Hub ({api.endpoint or constants.ENDPOINT}) did not "
            f"finish the upload to {repo} within {timeout_seconds:g}s (--hub_timeout_seconds); "
            "check the network and the Hub's status, then export again (a larger export over a "
            "slow link: raise --hub_timeout_seconds)"
        ) from None
    except Exception as e:  # noqa: BLE001 (the Hub's HTTP errors, and its transport's, which
        # differ by huggingface_hub version (requests, httpx): none is the export's fault)
        raise PretrainedError(
            f"the export is in {out}, but uploading it to {repo} failed ({one_line(e, 200)}); "
            f"check the repository's name and your rights to it ({LOGIN}), then upload the "
            f"folder as it is: {retry_command(out, repo, manifest, private)}"
        ) from e
    return getattr(commit, "commit_url", None) or f"https://huggingface.co/{repo}"


def retry_command(out: str, repo: str, manifest: dict, private: bool = False) -> str:
    """The `hf upload` command (huggingface_hub's CLI) that uploads the finished export in
    `out` as `push` would: its listed files and export.json only, by top-level folder or name,
    so that a failed upload needs no second restore and export."""
    from electra_jax.hf.previous import MANIFEST

    tops = {f.split("/", 1)[0] + "/*" if "/" in f else f for f in [*manifest["files"], MANIFEST]}
    command = ["hf", "upload", repo, out, ".", "--repo-type=model"]
    command += [f"--include={pattern}" for pattern in sorted(tops)]
    return shlex.join(command + (["--private"] if private else []))
