"""The REST API of padellm-ner: entities, models, probes, metrics and a highlighting page."""
