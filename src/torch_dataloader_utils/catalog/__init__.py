"""From paths to a catalog: discovery, footers read in parallel, schema unification, the split plan."""
