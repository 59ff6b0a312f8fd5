"""Small embedded models: the demo's tiny hybrid target and its MTP draft head."""
from .tiny_hybrid import (DEMO_CONFIG, TinyHybridTarget, TinyMTPDraft,  # noqa: F401
                          load_demo_checkpoint, make_demo_checkpoint, make_demo_weights)
