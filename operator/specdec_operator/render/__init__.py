"""Pure builders of the objects a SpeculativeModel owns: dicts ready for server-side apply."""
