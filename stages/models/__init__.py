"""Model code: the hybrid target (attention, Gated DeltaNet, MoE), the drafters, artifact loading, tokenizer."""
