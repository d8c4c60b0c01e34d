"""One screen per file: the four main screens (modes) and the modal dialogs they open."""
