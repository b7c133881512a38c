package shopv1

//go:generate go tool outboxgen bind
