"""Redis: every key (`keys`), every script (`lua/`, `scripts`) and the typed calls over them."""
