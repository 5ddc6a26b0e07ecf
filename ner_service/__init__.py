"""padellm-ner: named-entity recognition by parallel decoding of LLMs."""
