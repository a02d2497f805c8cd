"""eval's progress bar on stderr: answers done of all the run needs, and the time left."""

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
        TextColumn("answers"),  # every sampler's, each seed's: not items
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    # Drawn from the first item on: a run refused before it starts (a sealed file) leaves no bar.
    bar = Progress(*columns, console=Console(stderr=True), transient=False)
    first = {}

    def progress(done, total, description):
        if not first:
            # Items already done (a resumed run) must not count towards the
            # speed the ETA is computed from: start the bar after them.
            first["done"] = done
            bar.start()
            first["job"] = bar.add_task(description, total=total - done, completed=0)
        else:
            bar.update(first["job"], completed=done - first["done"], description=description)

    try:
        return run(llm, tokenizer, task_list, cfg, out_dir=out, make_sampler=factory, progress=progress)
    finally:
        bar.stop()
