"""The MARS authors' published GPT-2 runs, transcribed once from AGI-Arena/MARS at commit 4831e28 (each value with
the line that sets it), and what each paper preset of ours must therefore be, key for key.

Their trainers are nanoGPT-style scripts: a block of defaults (``TRAINER_DEFAULTS``), then a config file
executed over them (``CONFIGS``, launched by ``scripts/run_*.sh`` and ``MARS_M/scripts/run_*.sh`` with the
same batch size and accumulation on 8 GPUs, ``torchrun --nproc_per_node=8``). ``TRAINER_CODE`` holds what their
code fixes outside those variables, ``OPTIMIZER_CODE`` the defaults of their optimizer classes that their
trainers do not pass. ``authors_settings`` turns one run into our config keys; ``OURS`` lists, with the reason,
the keys that have no counterpart in their runs and the value every preset holds them at.
"""

TRAINER_DEFAULTS = {
    'MARS/train_adamw.py': {
        'eval_interval': (2000, 22), 'log_interval': (1, 23), 'eval_iters': (200, 24), 'dataset': ('openwebtext', 33),
        'gradient_accumulation_steps': (5, 34), 'batch_size': (12, 35), 'block_size': (1024, 36), 'n_layer': (12, 38),
        'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41), 'bias': (False, 42),
        'optimizer_name': ('adamw', 44), 'learning_rate': (0.0006, 45), 'max_iters': (600000, 46),
        'weight_decay': (0.1, 47), 'beta1': (0.9, 48), 'beta2': (0.95, 49), 'grad_clip': (1.0, 50),
        'schedule': ('cosine', 53), 'decay_lr': (True, 55), 'warmup_iters': (2000, 56),
        'lr_decay_iters': (600000, 57), 'min_lr': (6e-05, 58), 'dtype': ('bfloat16', 63), 'compile': (True, 64),
        'scale_attn_by_inverse_layer_idx': (True, 65),
    },
    'MARS/train_mars.py': {
        'eval_interval': (2000, 21), 'log_interval': (1, 22), 'eval_iters': (200, 23), 'dataset': ('openwebtext', 32),
        'gradient_accumulation_steps': (5, 33), 'batch_size': (12, 34), 'block_size': (1024, 36), 'n_layer': (12, 38),
        'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41), 'bias': (False, 42),
        'optimizer_name': ('mars', 44), 'learning_rate': (0.0006, 45), 'max_iters': (600000, 46),
        'weight_decay': (0.1, 47), 'beta1': (0.95, 48), 'beta2': (0.99, 49), 'grad_clip': (1.0, 50),
        'decay_lr': (True, 54), 'warmup_iters': (2000, 55), 'lr_decay_iters': (600000, 56), 'min_lr': (6e-05, 57),
        'dtype': ('bfloat16', 62), 'compile': (True, 63), 'scale_attn_by_inverse_layer_idx': (True, 64),
        'schedule': ('cosine', 66), 'gamma': (0.025, 68), 'lr_1d': (0.003, 69), 'is_approx': (True, 70),
        'mars_type': ('mars-adamw', 71), 'optimize_1d': (False, 72), 'weight_decay_1d': (0.1, 73),
        'betas_1d': ((0.9, 0.95), 74),
    },
    'MARS/train_muon.py': {
        'eval_interval': (2000, 20), 'log_interval': (1, 21), 'eval_iters': (200, 22), 'dataset': ('openwebtext', 31),
        'gradient_accumulation_steps': (5, 32), 'batch_size': (12, 33), 'block_size': (1024, 34), 'n_layer': (12, 36),
        'n_head': (12, 37), 'n_embd': (768, 38), 'dropout': (0.0, 39), 'bias': (False, 40),
        'optimizer_name': ('muon', 42), 'learning_rate': (0.0006, 43), 'muon_learning_rate': (0.02, 44),
        'max_iters': (600000, 45), 'weight_decay': (0.1, 46), 'muon_weight_decay': (0.0, 47), 'beta1': (0.95, 48),
        'beta2': (0.99, 49), 'grad_clip': (1.0, 50), 'decay_lr': (True, 54), 'warmup_iters': (2000, 55),
        'lr_decay_iters': (600000, 57), 'min_lr': (6e-05, 58), 'schedule': ('cosine', 61), 'dtype': ('bfloat16', 64),
        'compile': (True, 65), 'scale_attn_by_inverse_layer_idx': (True, 66),
    },
    'MARS/train_adamw_fw.py': {
        'eval_interval': (2000, 19), 'log_interval': (1, 20), 'eval_iters': (200, 21),
        'dataset': ('fineweb-edu100B', 30), 'gradient_accumulation_steps': (5, 31), 'batch_size': (12, 32),
        'block_size': (1024, 33), 'n_layer': (12, 35), 'n_head': (12, 36), 'n_embd': (768, 37), 'dropout': (0.0, 38),
        'bias': (False, 39), 'optimizer_name': ('adamw', 41), 'learning_rate': (0.0006, 42),
        'max_iters': (600000, 43), 'weight_decay': (0.1, 44), 'beta1': (0.9, 45), 'beta2': (0.95, 46),
        'grad_clip': (1.0, 47), 'schedule': ('cosine', 50), 'decay_lr': (True, 52), 'warmup_iters': (2000, 53),
        'lr_decay_iters': (600000, 54), 'min_lr': (6e-05, 55), 'dtype': ('bfloat16', 60), 'compile': (True, 61),
        'scale_attn_by_inverse_layer_idx': (True, 62),
    },
    'MARS/train_mars_fw.py': {
        'eval_interval': (2000, 21), 'log_interval': (1, 22), 'eval_iters': (200, 23),
        'dataset': ('fineweb-edu100B', 32), 'gradient_accumulation_steps': (5, 33), 'batch_size': (12, 34),
        'block_size': (1024, 36), 'n_layer': (12, 38), 'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41),
        'bias': (False, 42), 'optimizer_name': ('mars', 44), 'learning_rate': (0.0006, 45), 'max_iters': (600000, 46),
        'weight_decay': (0.1, 47), 'beta1': (0.95, 48), 'beta2': (0.99, 49), 'grad_clip': (1.0, 50),
        'decay_lr': (True, 54), 'warmup_iters': (2000, 55), 'lr_decay_iters': (600000, 56), 'min_lr': (6e-05, 57),
        'dtype': ('bfloat16', 62), 'compile': (True, 63), 'scale_attn_by_inverse_layer_idx': (True, 64),
        'schedule': ('cosine', 66), 'gamma': (0.025, 68), 'lr_1d': (0.003, 69), 'is_approx': (True, 70),
        'mars_type': ('mars-adamw', 71), 'optimize_1d': (False, 72), 'weight_decay_1d': (0.1, 73),
        'betas_1d': ((0.9, 0.95), 74),
    },
    'MARS_M/train_mars_m.py': {
        'eval_interval': (2000, 21), 'log_interval': (1, 22), 'eval_iters': (200, 23), 'dataset': ('openwebtext', 32),
        'gradient_accumulation_steps': (5, 33), 'batch_size': (12, 34), 'block_size': (1024, 36), 'n_layer': (12, 38),
        'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41), 'bias': (False, 42),
        'optimizer_name': ('mars-m', 44), 'learning_rate': (0.0006, 45), 'max_iters': (600000, 46),
        'weight_decay': (0.1, 47), 'beta1': (0.95, 48), 'beta2': (0.99, 49), 'grad_clip': (1.0, 50),
        'decay_lr': (True, 54), 'warmup_iters': (2000, 55), 'lr_decay_iters': (600000, 56), 'min_lr': (6e-05, 57),
        'dtype': ('bfloat16', 62), 'compile': (True, 63), 'scale_attn_by_inverse_layer_idx': (True, 64),
        'schedule': ('cosine', 66), 'gamma': (0.025, 68), 'clip_c': (False, 69), 'lr_1d': (0.003, 70),
        'is_approx': (True, 71), 'betas_1d': ((0.9, 0.95), 72),
    },
    'MARS_M/train_moonlight.py': {
        'eval_interval': (2000, 21), 'log_interval': (1, 22), 'eval_iters': (200, 23), 'dataset': ('openwebtext', 32),
        'gradient_accumulation_steps': (5, 33), 'batch_size': (12, 34), 'block_size': (1024, 36), 'n_layer': (12, 38),
        'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41), 'bias': (False, 42),
        'optimizer_name': ('moonlight', 44), 'learning_rate': (0.0006, 45), 'max_iters': (600000, 46),
        'weight_decay': (0.1, 47), 'beta1': (0.95, 48), 'beta2': (0.99, 49), 'grad_clip': (1.0, 50),
        'decay_lr': (True, 54), 'warmup_iters': (2000, 55), 'lr_decay_iters': (600000, 56), 'min_lr': (6e-05, 57),
        'dtype': ('bfloat16', 62), 'compile': (True, 63), 'scale_attn_by_inverse_layer_idx': (True, 64),
        'schedule': ('cosine', 66), 'betas_1d': ((0.9, 0.95), 68),
    },
    'MARS_M/train_mars_m_fw.py': {
        'eval_interval': (2000, 21), 'log_interval': (1, 22), 'eval_iters': (200, 23),
        'dataset': ('fineweb-edu100B', 32), 'gradient_accumulation_steps': (5, 33), 'batch_size': (12, 34),
        'block_size': (1024, 36), 'n_layer': (12, 38), 'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41),
        'bias': (False, 42), 'optimizer_name': ('mars-m', 44), 'learning_rate': (0.0006, 45),
        'max_iters': (600000, 46), 'weight_decay': (0.1, 47), 'beta1': (0.95, 48), 'beta2': (0.99, 49),
        'grad_clip': (1.0, 50), 'decay_lr': (True, 54), 'warmup_iters': (2000, 55), 'lr_decay_iters': (600000, 56),
        'min_lr': (6e-05, 57), 'dtype': ('bfloat16', 62), 'compile': (True, 63),
        'scale_attn_by_inverse_layer_idx': (True, 64), 'schedule': ('cosine', 66), 'gamma': (0.025, 68),
        'clip_c': (False, 69), 'lr_1d': (0.003, 70), 'is_approx': (True, 71), 'betas_1d': ((0.9, 0.95), 72),
    },
    'MARS_M/train_moonlight_fw.py': {
        'eval_interval': (2000, 21), 'log_interval': (1, 22), 'eval_iters': (200, 23),
        'dataset': ('fineweb-edu100B', 32), 'gradient_accumulation_steps': (5, 33), 'batch_size': (12, 34),
        'block_size': (1024, 36), 'n_layer': (12, 38), 'n_head': (12, 39), 'n_embd': (768, 40), 'dropout': (0.0, 41),
        'bias': (False, 42), 'optimizer_name': ('moonlight', 44), 'learning_rate': (0.0006, 45),
        'max_iters': (600000, 46), 'weight_decay': (0.1, 47), 'beta1': (0.95, 48), 'beta2': (0.99, 49),
        'grad_clip': (1.0, 50), 'decay_lr': (True, 54), 'warmup_iters': (2000, 55), 'lr_decay_iters': (600000, 56),
        'min_lr': (6e-05, 57), 'dtype': ('bfloat16', 62), 'compile': (True, 63),
        'scale_attn_by_inverse_layer_idx': (True, 64), 'schedule': ('cosine', 66), 'betas_1d': ((0.9, 0.95), 68),
    },
}
TRAINER_CODE = {
    'MARS/train_adamw.py': {
        'vocab_size': (50304, 164), 'tf32': (True, 119), 'seed': (5000, 118), 'window': 132, 'estimate_loss': 225,
    },
    'MARS/train_mars.py': {
        'vocab_size': (50304, 172), 'tf32': (True, 127), 'seed': (5000, 126), 'window': 140, 'estimate_loss': 236,
    },
    'MARS/train_muon.py': {
        'vocab_size': (50304, 165), 'tf32': (True, 120), 'seed': (5000, 119), 'window': 133, 'estimate_loss': 235,
    },
    'MARS/train_adamw_fw.py': {
        'vocab_size': (50304, 168), 'tf32': (True, 116), 'seed': (5000, 115), 'window': 136, 'estimate_loss': 229,
    },
    'MARS/train_mars_fw.py': {
        'vocab_size': (50304, 179), 'tf32': (True, 127), 'seed': (5000, 126), 'window': 147, 'estimate_loss': 243,
    },
    'MARS_M/train_mars_m.py': {
        'vocab_size': (50304, 170), 'tf32': (True, 125), 'seed': (5000, 124), 'window': 138, 'estimate_loss': 240,
    },
    'MARS_M/train_moonlight.py': {
        'vocab_size': (50304, 166), 'tf32': (True, 121), 'seed': (5000, 120), 'window': 134, 'estimate_loss': 236,
    },
    'MARS_M/train_mars_m_fw.py': {
        'vocab_size': (50304, 177), 'tf32': (True, 125), 'seed': (5000, 124), 'window': 145, 'estimate_loss': 247,
    },
    'MARS_M/train_moonlight_fw.py': {
        'vocab_size': (50304, 173), 'tf32': (True, 121), 'seed': (5000, 120), 'window': 141, 'estimate_loss': 243,
    },
}
CONFIGS = {
    'MARS_M/config/train_gpt2_large_mars_m.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (36, 9),
        'n_head': (20, 10), 'n_embd': (1280, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('mars-m', 26), 'learning_rate': (0.005, 27), 'weight_decay': (0.01, 28),
        'beta1': (0.95, 29), 'beta2': (0.99, 30), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (1e-05, 36), 'compile': (True, 38), 'gamma': (0.025, 41),
    },
    'MARS_M/config/train_gpt2_large_moonlight.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (36, 9),
        'n_head': (20, 10), 'n_embd': (1280, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('moonlight', 26), 'learning_rate': (0.005, 27), 'weight_decay': (0.1, 28),
        'beta1': (0.95, 29), 'beta2': (0.99, 30), 'grad_clip': (1.0, 31), 'decay_lr': (True, 33),
        'warmup_iters': (2000, 34), 'min_lr': (1e-05, 35), 'compile': (True, 37),
    },
    'MARS_M/config/train_gpt2_medium_mars_m.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (24, 9),
        'n_head': (16, 10), 'n_embd': (1024, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('mars-m', 26), 'learning_rate': (0.005, 27), 'weight_decay': (0.01, 28),
        'beta1': (0.95, 29), 'beta2': (0.99, 30), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (6e-05, 36), 'compile': (True, 38), 'gamma': (0.025, 41),
    },
    'MARS_M/config/train_gpt2_medium_moonlight.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (24, 9),
        'n_head': (16, 10), 'n_embd': (1024, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('moonlight', 26), 'learning_rate': (0.005, 27), 'weight_decay': (0.1, 28),
        'beta1': (0.95, 29), 'beta2': (0.99, 30), 'grad_clip': (1.0, 31), 'decay_lr': (True, 33),
        'warmup_iters': (2000, 34), 'min_lr': (6e-05, 35), 'compile': (True, 37),
    },
    'MARS_M/config/train_gpt2_small_mars_m.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (12, 9),
        'n_head': (12, 10), 'n_embd': (768, 11), 'dropout': (0.0, 12), 'bias': (False, 13), 'max_iters': (100000, 16),
        'lr_decay_iters': (100000, 17), 'eval_interval': (1000, 20), 'eval_iters': (200, 21),
        'log_interval': (10, 22), 'optimizer_name': ('mars-m', 25), 'learning_rate': (0.006, 26),
        'weight_decay': (0.01, 27), 'beta1': (0.95, 28), 'beta2': (0.99, 29), 'grad_clip': (1.0, 31),
        'decay_lr': (True, 33), 'warmup_iters': (2000, 34), 'min_lr': (3e-05, 35), 'compile': (True, 37),
        'gamma': (0.025, 40),
    },
    'MARS_M/config/train_gpt2_small_moonlight.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (12, 9),
        'n_head': (12, 10), 'n_embd': (768, 11), 'dropout': (0.0, 12), 'bias': (False, 13), 'max_iters': (100000, 16),
        'lr_decay_iters': (100000, 17), 'eval_interval': (1000, 20), 'eval_iters': (200, 21),
        'log_interval': (10, 22), 'optimizer_name': ('moonlight', 25), 'learning_rate': (0.006, 26),
        'weight_decay': (0.1, 27), 'beta1': (0.95, 28), 'beta2': (0.99, 29), 'grad_clip': (1.0, 30),
        'decay_lr': (True, 32), 'warmup_iters': (2000, 33), 'min_lr': (3e-05, 34), 'compile': (True, 36),
    },
    'MARS_M/config/train_gpt2_xl_mars_m.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (48, 9),
        'n_head': (25, 10), 'n_embd': (1600, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('mars-m', 26), 'learning_rate': (0.003, 27), 'weight_decay': (0.01, 28),
        'beta1': (0.95, 29), 'beta2': (0.99, 30), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (1e-05, 36), 'compile': (True, 38), 'gamma': (0.025, 41),
    },
    'MARS_M/config/train_gpt2_xl_moonlight.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (48, 9),
        'n_head': (25, 10), 'n_embd': (1600, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('moonlight', 26), 'learning_rate': (0.003, 27), 'weight_decay': (0.1, 28),
        'beta1': (0.95, 29), 'beta2': (0.99, 30), 'grad_clip': (1.0, 31), 'decay_lr': (True, 33),
        'warmup_iters': (2000, 34), 'min_lr': (1e-05, 35), 'compile': (True, 37),
    },
    'config/train_gpt2_large_adamw.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (36, 9),
        'n_head': (20, 10), 'n_embd': (1280, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('adamw', 26), 'learning_rate': (0.0002, 27), 'weight_decay': (0.1, 28), 'beta1': (0.9, 29),
        'beta2': (0.95, 30), 'grad_clip': (1.0, 31), 'decay_lr': (True, 33), 'warmup_iters': (2000, 34),
        'min_lr': (1e-05, 35), 'compile': (True, 37),
    },
    'config/train_gpt2_large_mars.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (36, 9),
        'n_head': (20, 10), 'n_embd': (1280, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('mars', 26), 'learning_rate': (0.002, 27), 'weight_decay': (0.01, 28), 'beta1': (0.95, 29),
        'beta2': (0.99, 30), 'lr_1d': (0.001, 31), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (1e-05, 36), 'compile': (True, 38), 'gamma': (0.025, 41),
    },
    'config/train_gpt2_large_muon.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (36, 9),
        'n_head': (20, 10), 'n_embd': (1280, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('muon', 26), 'learning_rate': (0.001, 27), 'weight_decay': (0.1, 28),
        'muon_learning_rate': (0.00667, 29), 'muon_weight_decay': (0.0, 30), 'beta1': (0.9, 31), 'beta2': (0.95, 32),
        'grad_clip': (1.0, 33), 'decay_lr': (True, 35), 'warmup_iters': (2000, 36), 'min_lr': (1e-05, 37),
        'compile': (True, 39),
    },
    'config/train_gpt2_medium_adamw.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (24, 9),
        'n_head': (16, 10), 'n_embd': (1024, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('adamw', 26), 'learning_rate': (0.0003, 27), 'weight_decay': (0.1, 28), 'beta1': (0.9, 29),
        'beta2': (0.95, 30), 'grad_clip': (1.0, 31), 'decay_lr': (True, 33), 'warmup_iters': (2000, 34),
        'min_lr': (6e-05, 35), 'compile': (True, 37),
    },
    'config/train_gpt2_medium_mars.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (24, 9),
        'n_head': (16, 10), 'n_embd': (1024, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('mars', 26), 'learning_rate': (0.003, 27), 'weight_decay': (0.01, 28), 'beta1': (0.95, 29),
        'beta2': (0.99, 30), 'lr_1d': (0.0015, 31), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (6e-05, 36), 'compile': (True, 38), 'gamma': (0.025, 41),
    },
    'config/train_gpt2_medium_muon.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (24, 9),
        'n_head': (16, 10), 'n_embd': (1024, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('muon', 26), 'learning_rate': (0.0015, 27), 'weight_decay': (0.1, 28),
        'muon_learning_rate': (0.01, 29), 'muon_weight_decay': (0.0, 30), 'beta1': (0.9, 31), 'beta2': (0.95, 32),
        'grad_clip': (1.0, 33), 'decay_lr': (True, 35), 'warmup_iters': (2000, 36), 'min_lr': (6e-05, 37),
        'compile': (True, 39),
    },
    'config/train_gpt2_small_adamw.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (12, 9),
        'n_head': (12, 10), 'n_embd': (768, 11), 'dropout': (0.0, 12), 'bias': (False, 13), 'max_iters': (100000, 16),
        'lr_decay_iters': (100000, 17), 'eval_interval': (1000, 20), 'eval_iters': (200, 21),
        'log_interval': (10, 22), 'optimizer_name': ('adamw', 25), 'learning_rate': (0.0006, 26),
        'weight_decay': (0.1, 27), 'beta1': (0.9, 28), 'beta2': (0.95, 29), 'grad_clip': (1.0, 30),
        'decay_lr': (True, 32), 'warmup_iters': (2000, 33), 'min_lr': (3e-05, 34), 'compile': (True, 36),
    },
    'config/train_gpt2_small_mars.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (12, 9),
        'n_head': (12, 10), 'n_embd': (768, 11), 'dropout': (0.0, 12), 'bias': (False, 13), 'max_iters': (100000, 16),
        'lr_decay_iters': (100000, 17), 'eval_interval': (1000, 20), 'eval_iters': (200, 21),
        'log_interval': (10, 22), 'optimizer_name': ('mars', 25), 'learning_rate': (0.006, 26),
        'weight_decay': (0.01, 27), 'beta1': (0.95, 28), 'beta2': (0.99, 29), 'lr_1d': (0.003, 30),
        'grad_clip': (1.0, 31), 'decay_lr': (True, 33), 'warmup_iters': (2000, 34), 'min_lr': (3e-05, 35),
        'compile': (True, 37), 'gamma': (0.025, 40),
    },
    'config/train_gpt2_small_muon.py': {
        'batch_size': (15, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (4, 7), 'n_layer': (12, 9),
        'n_head': (12, 10), 'n_embd': (768, 11), 'dropout': (0.0, 12), 'bias': (False, 13), 'max_iters': (100000, 16),
        'lr_decay_iters': (100000, 17), 'eval_interval': (1000, 20), 'eval_iters': (200, 21),
        'log_interval': (10, 22), 'optimizer_name': ('muon', 25), 'learning_rate': (0.003, 26),
        'weight_decay': (0.1, 27), 'muon_learning_rate': (0.02, 28), 'muon_weight_decay': (0.0, 29),
        'beta1': (0.9, 30), 'beta2': (0.95, 31), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (3e-05, 36), 'schedule': ('cosine', 37), 'compile': (True, 38),
    },
    'config/train_gpt2_xl_adamw.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (48, 9),
        'n_head': (25, 10), 'n_embd': (1600, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('adamw', 26), 'learning_rate': (0.0002, 27), 'weight_decay': (0.1, 28), 'beta1': (0.9, 29),
        'beta2': (0.95, 30), 'grad_clip': (1.0, 31), 'decay_lr': (True, 33), 'warmup_iters': (2000, 34),
        'min_lr': (1e-05, 35), 'compile': (True, 37),
    },
    'config/train_gpt2_xl_mars.py': {
        'batch_size': (5, 5), 'block_size': (1024, 6), 'gradient_accumulation_steps': (12, 7), 'n_layer': (48, 9),
        'n_head': (25, 10), 'n_embd': (1600, 11), 'dropout': (0.0, 12), 'bias': (False, 13),
        'scale_attn_by_inverse_layer_idx': (True, 14), 'max_iters': (100000, 17), 'lr_decay_iters': (100000, 18),
        'eval_interval': (1000, 21), 'eval_iters': (200, 22), 'log_interval': (10, 23),
        'optimizer_name': ('mars', 26), 'learning_rate': (0.002, 27), 'weight_decay': (0.01, 28), 'beta1': (0.95, 29),
        'beta2': (0.99, 30), 'lr_1d': (0.001, 31), 'grad_clip': (1.0, 32), 'decay_lr': (True, 34),
        'warmup_iters': (2000, 35), 'min_lr': (1e-05, 36), 'compile': (True, 38), 'gamma': (0.025, 41),
    },
}
# Defaults of their optimizer classes and model code that the trainers leave in place: (value, file:line).
OPTIMIZER_CODE = {
    "adamw": {"eps": (1e-8, "MARS/model.py:14, 330 (torch.optim.AdamW, no eps passed)")},
    "mars": {"eps": (1e-8, "MARS/optimizers/mars.py:56"), "amsgrad": (False, "MARS/optimizers/mars.py:56")},
    "muon": {"momentum": (0.95, "MARS/optimizers/muon.py:65"), "nesterov": (True, "MARS/optimizers/muon.py:65"),
             "ns_steps": (5, "MARS/optimizers/muon.py:66 (backend_steps)"),
             "adamw_eps": (1e-8, "MARS/optimizers/adamw.py:33"),
             # Their own AdamW class for the non-2-D tensors, and updates rounded to bfloat16.
             "adamw_variant": ("authors", "MARS/train_muon.py:210, 216"),
             "update_dtype": ("bfloat16", "MARS/optimizers/muon.py:87")},
    "mars-m": {"ns_steps": (5, "MARS_M/optimizers/mars_m.py:66"), "adamw_eps": (1e-8, "MARS_M/optimizers/mars_m.py:69"),
               # Their trainer passes clip_c=False (MARS_M/train_mars_m.py:69, 222), but the step clips c_t to
               # unit norm whatever the flag (MARS_M/optimizers/mars_m.py:198-199): our true is what ran.
               "clip_c": (True, "MARS_M/optimizers/mars_m.py:198-199"),
               "memory_efficient": (False, "MARS_M/train_mars_m.py:220 (mars_m, not mars_m_efficient)")},
    "moonlight": {"nesterov": (True, "MARS_M/optimizers/moonlight.py:70"),
                  "ns_steps": (5, "MARS_M/optimizers/moonlight.py:71"),
                  "adamw_eps": (1e-8, "MARS_M/optimizers/moonlight.py:74")},
}
MODEL_CODE = {"activation": ("gelu_tanh", "MARS/model.py:20-25, MARS_M/model.py:20-25 (new_gelu)")}
# AdamW, MARS and Muon keep the embeddings out of weight decay (MARS/model.py:285, 298; Muon's 2-D tensors,
# embeddings included, decay by muon_weight_decay=0: MARS/train_muon.py:216-217).
EMBEDDINGS_UNDECAYED = ("adamw", "mars", "muon")
GPUS = 8  # torchrun --nproc_per_node=8 in every scripts/run_*.sh

# Their published runs: (model size, optimizer) -> the config file their script launches. The MARS rows of the
# paper are the MARS-AdamW approximate scheme (MARS/train_mars.py:70-71); exact MARS is the same run with
# --is_approx=False (the branch at MARS/train_mars.py:345). Moonlight on GPT-2 XL: MARS_M/scripts/
# run_moonlight_xl_fw.sh launches train_adanw_fw.py (no such file) with the large config; the presets follow
# MARS_M/config/train_gpt2_xl_moonlight.py, the one config for that model.
RUNS = {(size, optimizer): f"config/train_gpt2_{size}_{optimizer}.py"
        for optimizer in ("adamw", "mars", "muon") for size in ("small", "medium", "large", "xl")
        if (size, optimizer) != ("xl", "muon")}
RUNS |= {(size, optimizer): f"MARS_M/config/train_gpt2_{size}_{optimizer.replace('-', '_')}.py"
         for optimizer in ("mars-m", "moonlight") for size in ("small", "medium", "large", "xl")}
TRAINERS = {("openwebtext", "adamw"): "MARS/train_adamw.py", ("openwebtext", "mars"): "MARS/train_mars.py",
            ("openwebtext", "muon"): "MARS/train_muon.py", ("openwebtext", "mars-m"): "MARS_M/train_mars_m.py",
            ("openwebtext", "moonlight"): "MARS_M/train_moonlight.py",
            ("fineweb-edu", "adamw"): "MARS/train_adamw_fw.py", ("fineweb-edu", "mars"): "MARS/train_mars_fw.py",
            ("fineweb-edu", "mars-m"): "MARS_M/train_mars_m_fw.py",
            ("fineweb-edu", "moonlight"): "MARS_M/train_moonlight_fw.py"}
# Their FineWeb-Edu trainers pick each micro-batch's shard with random.choice, then its windows inside it
# (MARS/train_mars_fw.py:141-149, the same in every *_fw.py); on OpenWebText, windows anywhere in train.bin.
SAMPLING = {"openwebtext": "random", "fineweb-edu": "random_shard"}


def authors_settings(size: str, optimizer: str, corpus: str) -> dict[str, object]:
    """Their run of ``optimizer`` on GPT-2 ``size`` and ``corpus`` as our flat config keys (``train.min_lr``)."""
    trainer = TRAINERS[corpus, optimizer]
    # The config file runs over the trainer's defaults.
    their = {name: value for name, (value, _) in TRAINER_DEFAULTS[trainer].items()}
    their |= {name: value for name, (value, _) in CONFIGS[RUNS[size, optimizer]].items()}
    code = TRAINER_CODE[trainer]
    accumulation = their["gradient_accumulation_steps"]
    settings = {
        "model.n_layer": their["n_layer"], "model.n_head": their["n_head"], "model.n_embd": their["n_embd"],
        "model.block_size": their["block_size"], "model.vocab_size": code["vocab_size"][0], "model.bias": their["bias"],
        "model.dropout": their["dropout"],
        "model.scale_attn_by_inverse_layer_idx": their["scale_attn_by_inverse_layer_idx"],
        "model.activation": MODEL_CODE["activation"][0],
        "data.name": corpus, "data.sampling": SAMPLING[corpus], "data.draws": "authors",
        "train.batch_size": their["batch_size"], "train.block_size": their["block_size"],
        "train.global_batch_size": their["batch_size"] * accumulation * GPUS,
        # Each GPU sums its micro-batches' gradients without dividing (the loss.backward() of every micro-batch,
        # MARS/train_mars.py:378-391) and DDP averages the GPUs: the optimizer sees accumulation x the mean.
        "train.grad_multiplier": float(accumulation),
        "train.max_iters": their["max_iters"],
        "train.decay_iters": None if their["lr_decay_iters"] == their["max_iters"] else their["lr_decay_iters"],
        "train.eval_interval": their["eval_interval"], "train.eval_iters": their["eval_iters"],
        "train.eval_sampling": "fresh", "train.log_interval": their["log_interval"],
        "train.lr_schedule": their["schedule"] if their["decay_lr"] else "constant",
        "train.warmup_iters": their["warmup_iters"], "train.min_lr": their["min_lr"],
        "train.grad_clip": their["grad_clip"], "train.tf32": code["tf32"][0],
        # bfloat16 autocast on CUDA: what our auto is there.
        "train.dtype": {"bfloat16": "auto"}[their["dtype"]],
        "train.compile": their["compile"], "train.seed": code["seed"][0],
        "optimizer.name": their["optimizer_name"],
        "optimizer.lr": their["learning_rate"], "optimizer.weight_decay": their["weight_decay"],
    }
    if optimizer in EMBEDDINGS_UNDECAYED:
        settings["optimizer.decay_embeddings"] = False
    betas = [their["beta1"], their["beta2"]]
    if optimizer == "adamw":
        settings["optimizer.betas"] = betas
    elif optimizer == "mars":
        settings |= {"optimizer.betas": betas, "optimizer.mars_type": their["mars_type"],
                     "optimizer.gamma": their["gamma"], "optimizer.is_approx": their["is_approx"],
                     "optimizer.optimize_1d": their["optimize_1d"], "optimizer.lr_1d": their["lr_1d"],
                     "optimizer.betas_1d": list(their["betas_1d"]),
                     "optimizer.weight_decay_1d": their["weight_decay_1d"]}
    elif optimizer == "muon":
        # Muon's lr and weight decay are muon_*; learning_rate and weight_decay are its AdamW part's
        # (MARS/train_muon.py:216-217).
        settings |= {"optimizer.lr": their["muon_learning_rate"],
                     "optimizer.weight_decay": their["muon_weight_decay"], "optimizer.adamw_lr": their["learning_rate"],
                     "optimizer.adamw_weight_decay": their["weight_decay"], "optimizer.adamw_betas": betas}
    else:
        # beta1 is the momentum and betas_1d the AdamW part's betas (MARS_M/train_mars_m.py:221-222,
        # MARS_M/train_moonlight.py:217-218).
        settings |= {"optimizer.momentum": their["beta1"], "optimizer.adamw_betas": list(their["betas_1d"])}
        if optimizer == "mars-m":
            settings |= {"optimizer.gamma": their["gamma"], "optimizer.is_approx": their["is_approx"]}
    settings |= {f"optimizer.{key}": value for key, (value, _) in OPTIMIZER_CODE[optimizer].items()}
    return settings


# Keys with no counterpart in their runs, at the value every paper preset holds them, and why.
OURS = {
    "train.grad_accum_steps": (1, "derived from train.global_batch_size and the GPU count at launch"),
    "train.decay_fraction": (0.2, "the wsd schedule's only: unused under cosine"),
    "train.compile_mode": ("default", "torch.compile's default mode, as their torch.compile(model)"),
    "train.loss_chunk_size": (0, "the plain head and loss, as theirs"),
    "train.device": ("auto", "CUDA when there is one"),
    "train.checkpoint_interval": (1000, "our checkpoints; theirs are written at evaluations"),
    "train.keep_checkpoints": (2, "our checkpoints"),
    "train.finished_checkpoints": ("all", "our checkpoints"),
    "train.resume": (False, "a fresh start"),
    "train.overwrite": (False, "a fresh start refuses another run's directory"),
    "train.hellaswag_interval": (0, "no HellaSwag during training, as theirs"),
    "train.hellaswag_file": (None, "no HellaSwag during training"),
    "train.hellaswag_items": (None, "no HellaSwag during training"),
    "train.max_skipped_steps": (0, "stop at a non-finite loss (theirs trains on: docs/paper.md)"),
    "train.diverged_val_loss_ratio": (1.1, "stop once the val loss is above the untrained model's (theirs trains on)"),
    "train.stop_on_diverged_val_loss": (True, "stop once the val loss is above the untrained model's"),
    "train.zero1": (False, "an unsharded optimizer state, as theirs"),
    "train.distributed_timeout_s": (600.0, "how long a rank waits for a frozen one; theirs is torch's 30 minutes"),
    "model.arch": ("gpt2", "GPT-2, their model (model/gpt.py)"),
    "model.intermediate_size": (2048, "the LLaMA model's only: unread by GPT-2"),
    "model.rms_norm_eps": (1e-6, "the LLaMA model's only: unread by GPT-2"),
    "model.rope_theta": (10000.0, "the LLaMA model's only: unread by GPT-2"),
    "model.tie_embeddings": (False, "the LLaMA model's only: GPT-2 always ties"),
    "wandb.mode": ("disabled", "logging only"),
    "wandb.project": ("mars-gpt2", "logging only"),
    "wandb.entity": (None, "logging only"),
    "wandb.init_timeout_s": (60.0, "logging only: how long a start waits for the wandb server"),
}
# How ours computes what theirs computes (the same kernels, or the Newton-Schulz form their code runs), per
# optimizer; MARS-AdamW runs no Newton-Schulz, so its ns_* keys are unread.
OURS_BY_OPTIMIZER = {
    "adamw": {},
    "mars": {"optimizer.backend": "auto", "optimizer.ns_dtype": "auto", "optimizer.ns_form": "products",
             "optimizer.ns_cuda_graph": False,
             "optimizer.ns_batch": False},
    "muon": {"optimizer.ns_dtype": "auto", "optimizer.ns_form": "products", "optimizer.ns_cuda_graph": False,
             "optimizer.ns_batch": False},
    # MARS-M and Moonlight decay every tensor (MARS_M/train_mars_m.py:221, train_moonlight.py:217): the key is
    # not read by them.
    "mars-m": {"optimizer.ns_dtype": "auto", "optimizer.ns_form": "gram", "optimizer.ns_cuda_graph": False,
               "optimizer.ns_batch": False, "optimizer.decay_embeddings": False},
    "moonlight": {"optimizer.ns_dtype": "auto", "optimizer.ns_form": "gram", "optimizer.ns_cuda_graph": False,
                  "optimizer.ns_batch": False, "optimizer.decay_embeddings": False},
}
