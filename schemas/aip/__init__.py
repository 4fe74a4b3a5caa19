"""AIP 1.0 body types: every payload this project publishes or reads, closed, in the shapes
of the public schemas of `getaip/core` (written here from shared/reference/aip-1.0-wire.md;
no upstream schema text is copied). `schemas.aip.messages` maps message types to them.
"""
