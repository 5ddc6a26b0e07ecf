"""Data readers, training-example builders, LoRA training and evaluation for PaDeLLM-NER."""
