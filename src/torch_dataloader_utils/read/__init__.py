"""Reading a chunk task's rows and converting them to tensors, in whatever process or thread runs it."""
