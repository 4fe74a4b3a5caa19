"""The AIP connector conformance report (`aip-hermes-worker conformance`, docs/aip.md
"Conformance report"): the 13 checks of upstream's connector conformance kit, answered by
this project's own tests tagged with the behaviour family they prove."""
