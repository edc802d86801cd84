"""Moses's files: phrase tables (phrasetable) and moses.ini (mosesini)."""
