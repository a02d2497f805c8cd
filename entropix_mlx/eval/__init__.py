"""Measuring: how often each sampler answers a task file correctly (`run_eval`),
what its free writing looks like (`run_open`, open-text mode), the metric
distributions a model card's thresholds come from (`calibrate`, `tune`), and
speed against mlx-lm (`bench`, `profile`).

Modules: `tasks` (task files, prompts, the dev/test split), `scoring` (answer
extraction, chain-of-thought answers), `stats` (Wilson intervals, the exact sign
test, the paired comparison against greedy), `store` (the result directory and
the resumable loop over runs both modes share), `runner` (the accuracy runner and
its summary), `opentext` (open-text metrics and their runner) and `report`
(tables and plots); the accuracy and open-text names are re-exported here, so
`from entropix_mlx import eval as ev; ev.run_eval(...)` reaches all of it.
"""

from .opentext import (
    DEFAULT_OPEN_TOKENS,
    EARLY_TOKENS,
    LOOP_ALERT,
    OpenConfig,
    OpenPrompt,
    builtin_prompts_path,
    distinct_n,
    load_prompts,
    longest_loop,
    repeated_ngram_share,
    run_open,
    sequence_logprobs,
    summarize_open,
    text_metrics,
)
from .report import format_p, markdown_table, open_table_rows, plot, plot_open, strategy_text, table_rows
from .runner import EvalConfig, machine_description, rows_for, run_eval, summarize
from .scoring import (
    LETTERS,
    cot_answer_line,
    extract_choice,
    extract_number,
    first_line,
    normalize,
    parse_number,
    score,
)
from .stats import Z95, holm, paired_comparison, paired_difference, sign_test, wilson_interval
from .store import ResultStore, common_prefix, item_seed, run_items, sampler_settings
from .summary import split_label, summarize_rows, with_budget
from .tasks import (
    CHOICE_PROMPT,
    COT_PROMPTS,
    NUMBER_PROMPT,
    PROMPT_VERSION,
    SPLIT_CHOICES,
    SPLITS,
    TEXT_PROMPT,
    Task,
    builtin_tasks_path,
    load_tasks,
    parse_task,
    select_split,
)
