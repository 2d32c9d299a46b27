//! memsnap-recorder (to be written).
