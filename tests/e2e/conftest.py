"""End-to-end tests: real vLLM engines and servers with the suite on the reference device.

Engines are expensive here (about a minute to start), so tests share them through
module-scoped fixtures; the Transformers references are computed once per session
(``references.py``). Every module here is marked ``slow``.
"""
