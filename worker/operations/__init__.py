"""Operations: one per Hermes route, each a capability with a manifest entry."""
