"""OpenVLA-OFT (7B) behind the Policy protocol: its config.json and action statistics (configuration.py), the model
(modeling.py), prompts and images (processing.py), the published checkpoint's layout (layout.py) and its SFT (sft.py)."""
