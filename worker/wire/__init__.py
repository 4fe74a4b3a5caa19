"""The bus as AIP 1.0 speaks it: each module maps one family of the project's internal types
to and from signed AIP Envelopes (`envelopes.py` is the one place an Envelope is sealed or
opened). The internal types (`schemas/*.py`) stay what the pipeline works on; only this
package knows how they travel.
"""
