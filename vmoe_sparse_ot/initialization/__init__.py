"""Reading other weights into flat {name: array} dicts and mapping them onto a model."""
