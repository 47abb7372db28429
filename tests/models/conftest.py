from model_fixtures import smollm2_dir, smollm2_tokenizer  # noqa: F401
