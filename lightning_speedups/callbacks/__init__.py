"""Lightning callbacks: each decides *when* to apply a technique and calls its functional counterpart."""
