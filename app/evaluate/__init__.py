"""Decisions made measurable: when two decisions agree, and (above the stages that decide)
running stored events again through a pipeline without publishing."""
