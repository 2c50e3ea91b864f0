"""Models written the way popular projects outside this repository write them (their public
structure, in our own code), as test subjects: shardwise must train them unchanged."""
