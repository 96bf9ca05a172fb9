"""The MARS authors' downstream table for GPT-2 on FineWeb-Edu (accuracy in %), as their README states it.

Source: AGI-Arena/MARS README.md, "Experiments on FineWeb-Edu" / "Evaluation Metrics", tables "Results on GPT-2
small" and "Results on GPT-2 XL" (repository state of 2026-03-25, commit 4831e28). They do not say which
lm-evaluation-harness version, shots or metric they used; their OpenAI GPT-2 rows (e.g. HellaSwag 31.14 for
GPT-2 small) look like lm_eval's zero-shot ``acc_norm`` where a task has it and ``acc`` elsewhere, which is what
:mod:`evaluation.downstream` reports beside them (an inference, not verified offline).
"""

# lm_eval task names, in the authors' column order, with their column titles.
TASKS = {"arc_easy": "ARC-E", "arc_challenge": "ARC-C", "boolq": "BoolQ", "hellaswag": "HellaSwag",
         "openbookqa": "OBQA", "piqa": "PIQA", "winogrande": "WG", "mmlu": "MMLU", "sciq": "SciQ"}

# {model size: {row label: [one value per task in TASKS order, then their average]}}
RESULTS = {
    "small": {
        "OpenAI-Comm.": [39.48, 22.70, 48.72, 31.14, 27.20, 62.51, 51.62, 22.92, 64.40, 41.19],
        "AdamW": [51.43, 26.54, 55.78, 36.26, 30.60, 64.53, 50.36, 24.49, 71.50, 45.72],
        "MARS-AdamW": [52.23, 27.39, 55.84, 36.91, 32.20, 64.80, 49.96, 22.95, 71.10, 45.93],
    },
    "xl": {
        "OpenAI-Comm.": [51.05, 28.50, 61.77, 50.89, 32.00, 70.51, 58.33, 25.24, 76.00, 50.48],
        "AdamW": [68.22, 38.40, 61.13, 53.93, 39.00, 72.69, 54.78, 25.47, 85.30, 55.43],
        "MARS-AdamW": [66.54, 39.85, 63.82, 56.52, 41.20, 73.34, 56.59, 23.86, 86.00, 56.41],
    },
}
