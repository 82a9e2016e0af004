"""Language-model policies (kind ``causal-lm``): contract, tokenizer, decoding, sampling."""
