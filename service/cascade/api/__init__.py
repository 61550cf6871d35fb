"""HTTP layer: validates, translates and streams; holds no algorithm."""
