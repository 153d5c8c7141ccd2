"""The prompts a head is trained and evaluated on, generated here (nothing is downloaded): short, varied, free-form
instructions (explanations, stories, lists, advice, comparisons, code, rewriting), one per (template, topic).

Held-out prompts use topics that no training prompt mentions, so held-out acceptance measures a head on text it has
not seen, not on memorized answers. They use the first 12 templates only (``TEMPLATES``), so the held-out set stays
the same when training prompts are added; training uses those and ``TRAIN_ONLY_TEMPLATES``. For a model without a
tokenizer (random-weight test models), prompts are random token ids from a seeded generator, again disjoint between
the splits (different seeds).
"""
from __future__ import annotations

import random

TEMPLATES = (
    "Explain {t} to a ten-year-old.",
    "Write a short story about {t}.",
    "List five interesting facts about {t}.",
    "What are the pros and cons of {t}?",
    "Give me three practical tips related to {t}.",
    "Write a haiku about {t}.",
    "Describe {t} in one paragraph.",
    "What is the history of {t}, briefly?",
    "Write a friendly email inviting a colleague to learn about {t}.",
    "Compare {t} with something similar and explain the differences.",
    "What common mistakes do beginners make with {t}?",
    "Summarize why {t} matters in two sentences.",
)

TRAIN_ONLY_TEMPLATES = (
    "Write a blog post introduction about {t}.",
    "Explain {t} step by step.",
    "What would a beginner's guide to {t} cover?",
    "Write a dialogue between two friends talking about {t}.",
    "Give a simple analogy that explains {t}.",
    "What are three questions a student might ask about {t}, with answers?",
    "Write a limerick about {t}.",
    "Describe a typical day for someone who works with {t}.",
    "What are some surprising myths about {t}?",
    "Write a product description for a book about {t}.",
    "How has {t} changed over the last hundred years?",
    "Write a short speech encouraging people to care about {t}.",
    "Explain {t} using only simple words.",
    "Create a quiz with three multiple-choice questions about {t}.",
    "What should I know before getting started with {t}?",
    "Write a diary entry from someone discovering {t} for the first time.",
    "List the key terms someone should learn about {t}, with short definitions.",
    "Write a news headline and a short article about {t}.",
    "What are the most important safety tips related to {t}?",
    "Explain how {t} affects everyday life.",
    "Write a short bedtime story that involves {t}.",
    "Give an outline for a presentation about {t}.",
    "What is the future of {t}?",
    "Answer like a teacher: why is {t} important?",
    "Write a short poem about {t}.",
    "Explain {t} as if you were a tour guide.",
    "What are five questions to ask an expert about {t}?",
    "Write a thank-you note to someone who taught you about {t}.",
    "Give me a one-week plan to learn the basics of {t}.",
    "What would happen if {t} disappeared tomorrow?",
    "Write a short encyclopedia entry about {t}.",
    "Explain the most important idea behind {t} in three sentences.",
    "Write a short conversation between a child and a grandparent about {t}.",
    "List three books or activities for someone curious about {t}.",
    "What is a fun fact about {t} that most people do not know?",
    "Write a short motivational message about {t}.",
)

TRAIN_TOPICS = (
    "photosynthesis", "the water cycle", "volcanoes", "black holes", "the French Revolution", "bread baking",
    "learning to swim", "electric cars", "honeybees", "the Roman Empire", "chess openings", "rainforests",
    "the immune system", "solar panels", "coffee", "jazz music", "the moon landing", "recycling", "tea ceremonies",
    "machine learning", "the stock market", "gardening tomatoes", "public libraries", "bicycles", "dinosaurs",
    "the internet", "oceans", "mountain climbing", "vaccines", "the printing press", "climate change",
    "python programming", "friendship", "running a marathon", "meditation", "earthquakes", "the human heart",
    "ancient Egypt", "video games", "sleep", "budgeting money", "wind turbines", "octopuses", "the Olympic games",
    "origami", "bridges", "electricity", "penguins", "writing poetry", "time zones", "vitamins",
    "the solar system", "painting with watercolors", "the human brain", "renewable energy", "sharks", "pizza",
    "the Great Wall of China", "photography", "the piano", "wolves", "airplanes", "the periodic table", "yoga",
    "ancient Greece", "coral reefs", "smartphones", "the Renaissance", "elephants", "composting", "tornadoes",
    "chocolate", "the Amazon river", "camping", "robots", "the Moon", "saving energy at home", "knitting",
    "the theory of evolution", "Mars", "football", "spiders", "cooking pasta", "the Industrial Revolution",
    "dogs", "cats", "the Eiffel Tower", "snow", "submarines", "learning math", "public speaking", "trains",
    "mushrooms", "the human skeleton", "skateboarding", "bees and flowers", "the Vikings", "magnets",
    "rain", "castles", "forests", "microscopes", "the alphabet", "cloud computing", "hiking", "birds migrating",
    "dolphins", "the Pyramids", "space stations", "water pollution", "sunflowers", "hot air balloons",
    "soccer", "the guitar", "crystals", "fireworks", "the telephone", "nutrition", "kites", "volunteering",
    "databases", "JavaScript", "sorting algorithms", "spreadsheets", "cybersecurity", "the Linux command line",
    "writing a resume", "job interviews", "learning to drive", "first aid", "houseplants", "bread mold",
    "the speed of light", "gravity", "atoms", "DNA", "the seasons", "tides", "thunderstorms", "rainbows",
    "frogs", "butterflies", "ants", "whales", "horses", "tigers", "pandas", "the printing of money",
    "taxes", "small businesses", "online shopping", "email etiquette", "museums", "opera", "ballet",
    "comic books", "science fiction", "mystery novels", "the Olympics of ancient times", "farming", "fishing",
    "clocks", "maps", "umbrellas", "glass making", "paper", "the color blue", "salt", "honey", "rice",
    "potatoes", "apples", "bananas", "coconuts", "olive oil", "spices", "soup", "breakfast", "baking cookies",
    "fermentation", "ice cream", "street food", "vegetarian cooking", "school lunches", "table manners",
    "birthdays", "weddings", "holidays around the world", "New Year celebrations", "family traditions",
    "grandparents", "siblings", "pets", "goldfish", "parrots", "rabbits", "turtles", "snakes", "crocodiles",
    "giraffes", "kangaroos", "koalas", "polar bears", "camels", "bats", "jellyfish", "starfish", "seahorses",
    "salmon", "eagles", "hummingbirds", "crows", "peacocks", "worms", "snails", "beetles", "mosquitoes",
    "fossils", "rocks and minerals", "sand", "caves", "islands", "lakes", "waterfalls", "wetlands", "prairies",
    "jungles", "the Arctic", "Antarctica", "the Himalayas", "the Sahara", "the Pacific Ocean", "hurricanes",
    "fog", "wind", "lightning", "droughts", "floods", "weather forecasts", "the ozone layer", "air pollution",
    "plastic waste", "endangered species", "national parks", "zoos", "bird watching", "beekeeping", "fishing boats",
    "sailing", "canoeing", "surfing", "skiing", "ice skating", "tennis", "basketball", "baseball", "cricket",
    "golf", "boxing", "gymnastics", "cycling races", "chess tournaments", "card games", "puzzles", "crosswords",
    "magic tricks", "circus acts", "theater", "movies", "animation", "cartoons", "radio", "television",
    "newspapers", "podcasts", "social media", "blogging", "letters and postcards", "handwriting", "calligraphy",
    "sign language", "learning a second language", "translation", "dictionaries", "grammar", "storytelling",
    "fairy tales", "myths and legends", "Greek mythology", "Norse mythology", "superheroes", "pirates", "knights",
    "samurai", "explorers", "Christopher Columbus", "Marco Polo", "Leonardo da Vinci", "Isaac Newton",
    "Albert Einstein", "Marie Curie", "Charles Darwin", "Ada Lovelace", "Shakespeare", "Mozart", "Beethoven",
    "Van Gogh", "the Mona Lisa", "sculpture", "architecture", "skyscrapers", "tunnels", "roads", "canals",
    "ports", "airports", "subways", "buses", "motorcycles", "trucks", "tractors", "rockets", "telescopes",
    "the Hubble telescope", "comets", "asteroids", "the Sun", "stars", "galaxies", "the Big Bang", "Jupiter",
    "Saturn's rings", "astronauts", "gravity on other planets", "light and shadows", "sound waves", "music theory",
    "drums", "the flute", "singing", "choirs", "orchestras", "rock music", "hip hop", "folk songs", "dance",
    "fashion", "sewing", "shoes", "hats", "colors in nature", "perfume", "soap", "toothbrushes", "sleep hygiene",
    "exercise", "walking", "stretching", "healthy snacks", "drinking water", "the common cold", "allergies",
    "the eyes", "the ears", "teeth", "the lungs", "blood", "bones and muscles", "the stomach", "germs",
    "antibiotics", "hospitals", "nurses", "doctors", "firefighters", "police officers", "teachers", "farmers",
    "chefs", "pilots", "engineers", "architects", "scientists", "artists", "writers", "journalists", "lawyers",
    "judges", "elections", "democracy", "the United Nations", "human rights", "money", "banks", "credit cards",
    "saving for retirement", "inflation", "supply and demand", "trade", "markets", "advertising", "brands",
    "customer service", "teamwork", "leadership", "time management", "procrastination", "habits", "goal setting",
    "note taking", "studying for exams", "homework", "online learning", "libraries of the future", "encyclopedias",
    "calculators", "computers", "keyboards", "the mouse", "printers", "web browsers", "search engines",
    "passwords", "encryption", "open source software", "version control with git", "debugging code", "unit tests",
    "functions in programming", "loops in programming", "recursion", "binary numbers", "data structures",
    "hash tables", "linked lists", "graphs in computer science", "operating systems", "computer networks",
    "artificial intelligence", "chatbots", "self-driving cars", "drones", "3D printing", "virtual reality",
    "video calls", "smart homes", "wearable devices", "electric bikes", "nuclear power", "hydropower",
    "geothermal energy", "oil and gas", "coal", "water treatment", "sewers", "garbage collection",
    "city parks", "gardening herbs", "growing vegetables", "trees in cities", "flowers", "roses", "cactus plants",
    "bamboo", "moss", "seeds", "soil", "earthworms in gardens", "bread from scratch", "pottery", "woodworking",
    "painting a room", "fixing a bike", "camping gear", "maps and compasses", "road trips", "packing a suitcase",
    "hotels", "trains in Europe", "visiting Japan", "visiting Italy", "Mexico", "India", "Brazil", "Canada",
    "Australia", "Africa's savanna", "the Alps", "Paris", "London", "New York City", "Tokyo", "Rome",
)

HELD_OUT_TOPICS = (
    "lighthouses", "the violin", "glaciers", "board games", "owls", "the Silk Road", "batteries", "kindness",
    "deserts", "cheese making", "satellites", "rivers",
)


def prompt_texts(split: str) -> list[str]:
    """Every prompt of ``split`` ("train": 48 templates x 493 topics = 23664; "held-out": the first 12 templates x 12
    topics = 144), in a fixed shuffled order (seeded), so a prefix of the list is a varied sample."""
    if split not in ("train", "held-out"):
        raise ValueError(f"split must be 'train' or 'held-out', got {split!r}")
    topics = TRAIN_TOPICS if split == "train" else HELD_OUT_TOPICS
    templates = TEMPLATES + TRAIN_ONLY_TEMPLATES if split == "train" else TEMPLATES
    texts = [tpl.format(t=topic) for topic in topics for tpl in templates]
    random.Random(0 if split == "train" else 1).shuffle(texts)
    return texts


def prompt_ids(target, split: str, count: int | None = None) -> list[list[int]]:
    """Token-id prompts for ``target``: the texts through its chat template (or plain encoding) when it has a
    tokenizer, else random ids (4..12 tokens; seed 0 for "train", 1 for "held-out"); ``count`` of them at most
    (the texts repeat no prompt: at most their number)."""
    tok = target.tokenizer
    if tok is None:
        rng = random.Random(0 if split == "train" else 1)
        n = count if count is not None else 256
        V = target.config.vocab_size
        return [[rng.randrange(V) for _ in range(rng.randint(4, 12))] for _ in range(n)]
    texts = prompt_texts(split)[:count]
    if getattr(tok, "chat_template", None):   # the way the head will be used: chat requests
        return [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True))
                for t in texts]
    return [tok.encode(t) for t in texts]
