"""What torch's caching allocator accepts and runs with: every key per torch version
(:mod:`.schema`), the strict parser of a settings string (:mod:`.parse`) and what the installed
torch reads and holds (:mod:`.installed`).

Shared core: %alloc_conf (allocator/) applies settings by it, the advice and memory/'s block
rounding read the settings torch runs with by it.
"""
