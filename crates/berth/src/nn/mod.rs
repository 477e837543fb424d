//! Neural-network building blocks: `Module`, `Linear`, state dicts.
