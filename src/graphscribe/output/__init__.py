"""What goes out: transcripts, NeMo's word and segment times, one writer per format."""
