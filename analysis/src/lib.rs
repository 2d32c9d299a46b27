//! memsnap-analysis (to be written).
