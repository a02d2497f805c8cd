"""eval's progress on stderr: the running sampler's items done of the items
asked for and, where the run holds more than one (several samplers or seeds),
the answers done of all it needs, each with the time left."""

from rich.console import Console


def run_with_progress(run, llm, tokenizer, task_list, cfg, out, factory):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    # Drawn from the first item on: a run refused before it starts (a sealed file) leaves no bar.
    bar = Progress(*columns, console=Console(stderr=True), transient=False)
    several = len(cfg.runs()) > 1
    jobs = {}

    def progress(done, total, description, run_done, run_items):
        # Counts given at the start (a resumed run's) are shown but make no speed: the ETA counts only new answers.
        if not jobs:
            bar.start()
            jobs["run"] = bar.add_task(description, total=run_items, completed=run_done, unit="items")
            if several:
                jobs["all"] = bar.add_task("all runs", total=total, completed=done, unit="answers")
        elif description != jobs.get("name", description):  # the next sampler or seed: its own clock
            bar.reset(jobs["run"], total=run_items, completed=run_done, description=description, unit="items")
        else:
            bar.update(jobs["run"], completed=run_done)
        if several:
            bar.update(jobs["all"], completed=done)
        jobs["name"] = description

    try:
        return run(llm, tokenizer, task_list, cfg, out_dir=out, make_sampler=factory, progress=progress)
    finally:
        bar.stop()
