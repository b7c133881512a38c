package orderspb

//go:generate go tool outboxgen bind
