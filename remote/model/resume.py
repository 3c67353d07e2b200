"""A discovered run's launch record turned back into a relaunch: its argv resumed
from the latest checkpoint where the framework's convention is known (HF Trainer
`--resume_from_checkpoint`, LightningCLI `--ckpt_path`) or a template says, secrets dropped."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from .launches import HF_RESUME, LIGHTNING_RESUME, PLACEHOLDERS, LaunchRecord, RelaunchError
from .snapshot import Checkpoint


def _with_option(argv: Sequence[str], option: str, value: str) -> tuple[list[str], bool]:
    """argv with `option value` set: an existing `option X` / `option=X` is replaced, else it
    is appended (after the script's own arguments: a launcher passes them on). → (argv,
    replaced)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word == option and i + 1 < len(out):
            out[i + 1] = value
            return out, True
        if word.startswith(option + "="):
            out[i] = f"{option}={value}"
            return out, True
    return [*out, option, value], False


def resume_argv(argv: Sequence[str], framework: str | None,
                checkpoint: str) -> tuple[list[str] | None, str]:
    """The argv resumed from `checkpoint` by the framework's convention → (argv or None when
    no convention applies, a note saying which convention or why none)."""
    words = set(argv)
    has = {opt: any(w == opt or w.startswith(opt + "=") for w in argv)
           for opt in (HF_RESUME, LIGHTNING_RESUME)}
    if has[HF_RESUME] or (framework == "hf" and ({"--output_dir", "--output-dir"} & words
                                                 or any(w.startswith("--output_dir=")
                                                        for w in argv))):
        new, replaced = _with_option(argv, HF_RESUME, checkpoint)
        how = "replaced" if replaced else "added"
        return new, (f"resumes from {checkpoint}: {how} {HF_RESUME} (HuggingFace Trainer's "
                     "argument)")
    if has[LIGHTNING_RESUME] or (framework == "lightning" and "fit" in words):
        new, replaced = _with_option(argv, LIGHTNING_RESUME, checkpoint)
        how = "replaced" if replaced else "added"
        return new, (f"resumes from {checkpoint}: {how} {LIGHTNING_RESUME} (LightningCLI's "
                     "argument)")
    if framework == "hf":
        why = (f"its checkpoints are HuggingFace Trainer's, but its arguments have no "
               f"--output_dir, so gpuwatch cannot tell the script takes {HF_RESUME}")
    elif framework == "lightning":
        why = ("its checkpoints are Lightning's, but it is not a LightningCLI `fit` command; "
               "Trainer.fit(ckpt_path=...) is set in the script's code")
    else:
        why = "gpuwatch does not know how this script resumes"
    return None, (f"starts from scratch with the same arguments although {checkpoint} exists: "
                  f"{why}; give a relaunch template with {{latest_checkpoint}} to resume")


def _fill(template: str, values: Mapping[str, str | None]) -> str:
    out, i = [], 0
    while i < len(template):
        hit = next((p for p in PLACEHOLDERS if template.startswith("{" + p + "}", i)), None)
        if hit is None:
            out.append(template[i])
            i += 1
            continue
        value = values[hit]
        if value is None:
            raise RelaunchError(hit)
        out.append(value)
        i += len(hit) + 2
    return "".join(out)


def relaunch_command(record: LaunchRecord, latest_checkpoint: str | Checkpoint | None,
                     template: str | None = None) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The exact command that starts a discovered run again, in `record.cwd` with
    `record.env` exported → (command, names of dropped secret variables, notes).

    template: `{command}` (the recorded argv, quoted), `{latest_checkpoint}`, `{workdir}`,
    `{run}` are filled in, values shell-quoted. Without one the recorded argv runs, with the
    resume argument pointed at the latest checkpoint where the convention is known (HF
    `--resume_from_checkpoint`, LightningCLI `--ckpt_path`). RelaunchError when the template
    needs a checkpoint and there is none."""
    checkpoint = getattr(latest_checkpoint, "path", latest_checkpoint)
    assert checkpoint is None or isinstance(checkpoint, str)
    notes: list[str] = []
    if template is not None:
        values = {"command": shlex.join(record.argv), "workdir": shlex.quote(record.cwd),
                  "run": shlex.quote(record.run),
                  "latest_checkpoint": shlex.quote(checkpoint) if checkpoint else None}
        try:
            command = _fill(template, values)
        except RelaunchError:
            where = f" ({record.checkpoints} matched nothing)" if record.checkpoints else ""
            raise RelaunchError(
                f"the relaunch template needs {{latest_checkpoint}} but run {record.run} has "
                f"no checkpoint{where}; use a template that starts from scratch") from None
        if checkpoint and "{latest_checkpoint}" in template:
            notes.append(f"resumes from {checkpoint}")
    elif checkpoint:
        resumed, note = resume_argv(record.argv, record.framework, checkpoint)
        command = shlex.join(resumed if resumed is not None else record.argv)
        notes.append(note)
    else:
        command = shlex.join(record.argv)
        notes.append("no checkpoint found: starts from scratch with the recorded arguments")
    notes.append(f"runs in {record.cwd} as recorded at launch (pid {record.pid}), with its "
                 f"environment ({len(record.env)} variables)" if record.env else
                 f"runs in {record.cwd}; the launch environment was not recorded "
                 f"({record.env_error or 'unknown why'}): the SSH session's is used")
    if record.dropped_secret:
        notes.append(
            f"not passed: {', '.join(record.dropped_secret)} — set at launch but named like a "
            "secret, so gpuwatch never read, stored or sent its value; put it on the box "  # U34
            "for the run (e.g. a ~/.netrc streamed over stdin), or a tracker that needs it "
            "may run disabled")
    if record.dropped_session:
        notes.append("the old login's variables are not passed: "
                     + ", ".join(record.dropped_session))
    return command, record.dropped_secret, tuple(notes)
