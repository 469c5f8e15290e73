"""Hand-worked cases that kill mutants the other algo tests let survive (docs/MUTATION.md)."""
