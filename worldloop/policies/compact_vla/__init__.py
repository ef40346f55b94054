"""The compact VLA: a ResNet image encoder, a frozen MiniLM instruction encoder and a transformer that decodes a
whole action chunk in one forward (configuration.py, modeling.py; trained by worldloop.policies.sft)."""
