#!/usr/bin/env python3
"""Writes examples/catalog/demo.json, the demo catalog `capstan serve` loads (docs/catalog-format.md).

Deterministic: stdlib only, one seeded random generator, no clock and no set iteration, so the same
script always writes the same bytes. Run it from anywhere:

    python3 examples/catalog/generate.py            # writes demo.json next to this script
    python3 examples/catalog/generate.py OUT.json   # or somewhere else
    python3 examples/catalog/check.py               # validates the result

What it makes: 5 cities (ROME PARIS LONDON NEW_YORK DUBAI), 7 categories per city with 2-3
subcategories each, 2 collections per city, and at least 20 products of each product type spread
over the cities, each with 1-3 variants. Exactly one product (an EVENT in LONDON) is a SEATMAP
product. About a third of the products carry translations (IT FR ES DE); the others fall back to
English. Only the fields documented in docs/catalog-format.md are written (the importer refuses
unknown fields).
"""

import json
import os
import random
import re
import sys
import unicodedata

SEED = 20261122
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "demo.json")

IMAGE_BASE = "https://images.example.com"
SITE_BASE = "https://tickets.example.com"
LANGS = ["IT", "FR", "ES", "DE"]

CURRENCIES = [
    {"code": "EUR", "currencyName": "Euro", "symbol": "€", "localSymbol": "€", "precision": 2, "rate": 1.0},
    {"code": "USD", "currencyName": "US Dollar", "symbol": "US$", "localSymbol": "$", "precision": 2, "rate": 1.08},
    {"code": "GBP", "currencyName": "British Pound", "symbol": "£", "localSymbol": "£", "precision": 2, "rate": 0.86},
    {"code": "JPY", "currencyName": "Japanese Yen", "symbol": "JP¥", "localSymbol": "¥", "precision": 0, "rate": 162.5},
    {"code": "AED", "currencyName": "UAE Dirham", "symbol": "AED", "localSymbol": "د.إ", "precision": 2, "rate": 3.97},
]


def place(name, lat, lon, address, postal, hood=None, kinds=(), tr=None, city=None, country=None):
    return {
        "name": name, "lat": lat, "lon": lon, "address": address, "postal": postal, "hood": hood,
        "kinds": list(kinds), "tr": tr or {}, "city": city, "country": country,
    }


def tr4(it, fr, es, de):
    return {"IT": it, "FR": fr, "ES": es, "DE": de}


# ---------------------------------------------------------------------------------------------
# Cities: landmarks (kinds say which product templates fit), event venues, transfer hubs, airports,
# day-trip destinations, a central meeting point, neighbourhoods, collections.
# ---------------------------------------------------------------------------------------------

# The IANA zone of each city's suppliers: the catalog's times are wall-clock times there.
TIME_ZONES = {"ROME": "Europe/Rome", "PARIS": "Europe/Paris", "LONDON": "Europe/London",
              "NEW_YORK": "America/New_York", "DUBAI": "Asia/Dubai"}

CITIES = [
    {
        "code": "ROME", "name": "Rome", "country": "Italy", "tr": tr4("Roma", "Rome", "Roma", "Rom"),
        "centre": place("Piazza Venezia", 41.8960, 12.4823, "Piazza Venezia", "00186", "Centro Storico"),
        "landmarks": [
            place("Colosseum", 41.8902, 12.4922, "Piazza del Colosseo", "00184", "Monti",
                  ["tour", "ticket", "monument", "outdoor"], tr4("Colosseo", "Colisée", "Coliseo", "Kolosseum")),
            place("Roman Forum", 41.8925, 12.4853, "Via della Salara Vecchia 5/6", "00186", "Monti",
                  ["tour", "ticket", "monument"], tr4("Foro Romano", "Forum romain", "Foro Romano", "Forum Romanum")),
            place("Vatican Museums", 41.9065, 12.4536, "Viale Vaticano", "00165", "Prati",
                  ["tour", "ticket", "museum"],
                  tr4("Musei Vaticani", "Musées du Vatican", "Museos Vaticanos", "Vatikanische Museen")),
            place("St. Peter's Basilica", 41.9022, 12.4539, "Piazza San Pietro", "00120", "Borgo",
                  ["tour", "ticket", "monument", "view"],
                  tr4("Basilica di San Pietro", "Basilique Saint-Pierre", "Basílica de San Pedro", "Petersdom"),
                  city="Vatican City", country="Vatican City"),
            place("Pantheon", 41.8986, 12.4769, "Piazza della Rotonda", "00186", "Centro Storico",
                  ["tour", "ticket", "monument"]),
            place("Trevi Fountain", 41.9009, 12.4833, "Piazza di Trevi", "00187", "Trevi",
                  ["tour", "outdoor"],
                  tr4("Fontana di Trevi", "Fontaine de Trevi", "Fontana de Trevi", "Trevi-Brunnen")),
            place("Castel Sant'Angelo", 41.9031, 12.4663, "Lungotevere Castello 50", "00193", "Prati",
                  ["tour", "ticket", "museum", "water", "view"]),
            place("Borghese Gallery", 41.9142, 12.4922, "Piazzale Scipione Borghese 5", "00197", "Pinciano",
                  ["ticket", "museum", "outdoor"],
                  tr4("Galleria Borghese", "Galerie Borghèse", "Galería Borghese", "Galleria Borghese")),
            place("Trastevere", 41.8897, 12.4695, "Piazza di Santa Maria in Trastevere", "00153", "Trastevere",
                  ["tour", "outdoor", "food"]),
            place("Tiber Island", 41.8906, 12.4779, "Isola Tiberina", "00186", "Ripa",
                  ["water", "outdoor"], tr4("Isola Tiberina", "Île Tibérine", "Isla Tiberina", "Tiberinsel")),
            place("Spanish Steps", 41.9060, 12.4828, "Piazza di Spagna", "00187", "Campo Marzio",
                  ["tour", "outdoor"],
                  tr4("Scalinata di Trinità dei Monti", "Escalier de la Trinité-des-Monts", "Escalinata de la Plaza de España", "Spanische Treppe")),
            place("Campo de' Fiori", 41.8956, 12.4722, "Piazza Campo de' Fiori", "00186", "Parione",
                  ["food", "tour"]),
        ],
        "venues": [
            place("Teatro dell'Opera di Roma", 41.9006, 12.4957, "Piazza Beniamino Gigli 7", "00184", "Esquilino",
                  ["opera", "concert"]),
            place("All Saints' Church", 41.9080, 12.4790, "Via del Babuino 153", "00187", "Campo Marzio",
                  ["concert"]),
            place("Auditorium Parco della Musica", 41.9292, 12.4749, "Viale Pietro de Coubertin 30", "00196",
                  "Flaminio", ["concert", "show", "party"]),
            place("Teatro di Marcello", 41.8919, 12.4798, "Via del Teatro di Marcello", "00186", "Sant'Angelo",
                  ["concert"]),
            place("Alexanderplatz Jazz Club", 41.9087, 12.4577, "Via Ostia 9", "00192", "Prati",
                  ["jazz", "party", "comedy"]),
        ],
        "hubs": [
            place("Termini Station", 41.9010, 12.5018, "Piazza dei Cinquecento", "00185", "Esquilino",
                  tr=tr4("Stazione Termini", "Gare de Termini", "Estación Termini", "Bahnhof Termini")),
            place("Civitavecchia Cruise Port", 42.0930, 11.7890, "Porto di Civitavecchia", "00053", None,
                  tr=tr4("Porto di Civitavecchia", "Port de Civitavecchia", "Puerto de Civitavecchia", "Hafen Civitavecchia"),
                  city="Civitavecchia"),
            place("Tiburtina Station", 41.9106, 12.5306, "Piazzale della Stazione Tiburtina", "00162", "Tiburtino",
                  tr=tr4("Stazione Tiburtina", "Gare de Tiburtina", "Estación Tiburtina", "Bahnhof Tiburtina")),
        ],
        "airports": [
            place("Fiumicino Airport (FCO)", 41.8003, 12.2389, "Via dell'Aeroporto di Fiumicino 320", "00054",
                  city="Fiumicino"),
            place("Ciampino Airport (CIA)", 41.7994, 12.5949, "Via Appia Nuova 1651", "00040", city="Ciampino"),
        ],
        "daytrips": [
            place("Pompeii", 40.7497, 14.4869, "", "", tr=tr4("Pompei", "Pompéi", "Pompeya", "Pompeji")),
            place("Tivoli", 41.9637, 12.7981, "", ""),
            place("Florence", 43.7696, 11.2558, "", "", tr=tr4("Firenze", "Florence", "Florencia", "Florenz")),
            place("Orvieto", 42.7185, 12.1107, "", ""),
        ],
        "neighbourhoods": ["Monti", "Trastevere", "Prati", "Centro Storico"],
        "collections": [("Ancient Rome", tr4("Roma antica", "Rome antique", "Roma antigua", "Antikes Rom")),
                        ("Vatican highlights", tr4("Il meglio del Vaticano", "Incontournables du Vatican", "Lo mejor del Vaticano", "Vatikan-Highlights"))],
    },
    {
        "code": "PARIS", "name": "Paris", "country": "France", "tr": tr4("Parigi", "Paris", "París", "Paris"),
        "centre": place("Place de la Concorde", 48.8656, 2.3212, "Place de la Concorde", "75008", "Champs-Élysées"),
        "landmarks": [
            place("Eiffel Tower", 48.8584, 2.2945, "5 Avenue Anatole France, Champ de Mars", "75007", "Gros-Caillou",
                  ["tour", "ticket", "view", "water", "outdoor"],
                  tr4("Torre Eiffel", "Tour Eiffel", "Torre Eiffel", "Eiffelturm")),
            place("Louvre Museum", 48.8606, 2.3376, "Rue de Rivoli", "75001", "Louvre",
                  ["tour", "ticket", "museum", "water"],
                  tr4("Museo del Louvre", "Musée du Louvre", "Museo del Louvre", "Louvre")),
            place("Notre-Dame Cathedral", 48.8530, 2.3499, "6 Parvis Notre-Dame, Place Jean-Paul II", "75004",
                  "Île de la Cité", ["tour", "ticket", "monument", "water"],
                  tr4("Cattedrale di Notre-Dame", "Cathédrale Notre-Dame", "Catedral de Notre Dame", "Kathedrale Notre-Dame")),
            place("Sacré-Cœur Basilica", 48.8867, 2.3431, "35 Rue du Chevalier de la Barre", "75018", "Montmartre",
                  ["tour", "outdoor", "view"],
                  tr4("Basilica del Sacro Cuore", "Basilique du Sacré-Cœur", "Basílica del Sagrado Corazón", "Sacré-Cœur")),
            place("Musée d'Orsay", 48.8600, 2.3266, "1 Rue de la Légion d'Honneur", "75007", "Saint-Germain",
                  ["ticket", "museum", "water"]),
            place("Arc de Triomphe", 48.8738, 2.2950, "Place Charles de Gaulle", "75008", "Champs-Élysées",
                  ["tour", "ticket", "view", "monument"],
                  tr4("Arco di Trionfo", "Arc de Triomphe", "Arco del Triunfo", "Triumphbogen")),
            place("Sainte-Chapelle", 48.8554, 2.3450, "10 Boulevard du Palais", "75001", "Île de la Cité",
                  ["ticket", "monument"]),
            place("Le Marais", 48.8575, 2.3622, "Place des Vosges", "75004", "Le Marais",
                  ["tour", "food", "outdoor"]),
            place("Saint-Germain-des-Prés", 48.8540, 2.3330, "Place Saint-Germain-des-Prés", "75006",
                  "Saint-Germain", ["food", "tour"]),
            place("Luxembourg Gardens", 48.8462, 2.3372, "Rue de Médicis", "75006", "Odéon",
                  ["outdoor"],
                  tr4("Giardini del Lussemburgo", "Jardin du Luxembourg", "Jardines de Luxemburgo", "Jardin du Luxembourg")),
            place("Pont Neuf", 48.8566, 2.3413, "Pont Neuf", "75001", "Île de la Cité", ["water"]),
        ],
        "venues": [
            place("Palais Garnier", 48.8720, 2.3316, "Place de l'Opéra", "75009", "Opéra", ["opera", "concert"]),
            place("Sainte-Chapelle", 48.8554, 2.3450, "10 Boulevard du Palais", "75001", "Île de la Cité",
                  ["concert"]),
            place("Moulin Rouge", 48.8841, 2.3322, "82 Boulevard de Clichy", "75018", "Pigalle", ["show", "party"]),
            place("Le Lido", 48.8718, 2.3009, "116 bis Avenue des Champs-Élysées", "75008", "Champs-Élysées",
                  ["show", "party"]),
            place("Duc des Lombards", 48.8597, 2.3480, "42 Rue des Lombards", "75001", "Les Halles",
                  ["jazz", "comedy"]),
        ],
        "hubs": [
            place("Gare du Nord", 48.8809, 2.3553, "18 Rue de Dunkerque", "75010", "La Chapelle"),
            place("Gare de Lyon", 48.8443, 2.3744, "Place Louis-Armand", "75012", "Bercy"),
            place("Disneyland Paris", 48.8722, 2.7758, "Boulevard de Parc", "77700", city="Chessy"),
            place("Palace of Versailles", 48.8049, 2.1204, "Place d'Armes", "78000",
                  tr=tr4("Reggia di Versailles", "Château de Versailles", "Palacio de Versalles", "Schloss Versailles"),
                  city="Versailles"),
        ],
        "airports": [
            place("Charles de Gaulle Airport (CDG)", 49.0097, 2.5479, "Roissy-en-France", "95700",
                  city="Roissy-en-France"),
            place("Orly Airport (ORY)", 48.7262, 2.3652, "Orly", "94390", city="Orly"),
            place("Beauvais Airport (BVA)", 49.4544, 2.1128, "Route de l'Aéroport", "60000", city="Tillé"),
        ],
        "daytrips": [
            place("Versailles", 48.8049, 2.1204, "", "", tr=tr4("Versailles", "Versailles", "Versalles", "Versailles")),
            place("Giverny", 49.0755, 1.5340, "", ""),
            place("Mont-Saint-Michel", 48.6361, -1.5115, "", ""),
            place("Reims and the Champagne region", 49.2583, 4.0317, "", "",
                  tr=tr4("Reims e la Champagne", "Reims et la Champagne", "Reims y la Champaña", "Reims und die Champagne")),
        ],
        "neighbourhoods": ["Le Marais", "Montmartre", "Saint-Germain", "Louvre"],
        "collections": [("Paris icons", tr4("Icone di Parigi", "Incontournables de Paris", "Iconos de París", "Pariser Ikonen")),
                        ("Art lovers' Paris", tr4("Parigi per gli amanti dell'arte", "Paris des amateurs d'art", "París para amantes del arte", "Paris für Kunstliebhaber"))],
    },
    {
        "code": "LONDON", "name": "London", "country": "United Kingdom",
        "tr": tr4("Londra", "Londres", "Londres", "London"),
        "centre": place("Trafalgar Square", 51.5080, -0.1281, "Trafalgar Square", "WC2N 5DN", "Westminster"),
        "landmarks": [
            place("Tower of London", 51.5081, -0.0759, "Tower Hill", "EC3N 4AB", "Tower Hill",
                  ["tour", "ticket", "monument", "water"],
                  tr4("Torre di Londra", "Tour de Londres", "Torre de Londres", "Tower of London")),
            place("Tower Bridge", 51.5055, -0.0754, "Tower Bridge Road", "SE1 2UP", "Bermondsey",
                  ["ticket", "view", "water", "outdoor"]),
            place("British Museum", 51.5194, -0.1270, "Great Russell Street", "WC1B 3DG", "Bloomsbury",
                  ["tour", "ticket", "museum"],
                  tr4("British Museum", "British Museum", "Museo Británico", "British Museum")),
            place("Westminster Abbey", 51.4994, -0.1273, "20 Deans Yard", "SW1P 3PA", "Westminster",
                  ["tour", "ticket", "monument"],
                  tr4("Abbazia di Westminster", "Abbaye de Westminster", "Abadía de Westminster", "Westminster Abbey")),
            place("London Eye", 51.5033, -0.1196, "Riverside Building, County Hall", "SE1 7PB", "South Bank",
                  ["ticket", "view", "water"]),
            place("Buckingham Palace", 51.5014, -0.1419, "Buckingham Palace Road", "SW1A 1AA", "St James's",
                  ["tour", "ticket", "monument"],
                  tr4("Palazzo di Buckingham", "Palais de Buckingham", "Palacio de Buckingham", "Buckingham Palace")),
            place("St Paul's Cathedral", 51.5138, -0.0984, "St Paul's Churchyard", "EC4M 8AD", "City of London",
                  ["tour", "ticket", "view", "monument"],
                  tr4("Cattedrale di St Paul", "Cathédrale Saint-Paul", "Catedral de San Pablo", "St Paul's Cathedral")),
            place("Covent Garden", 51.5117, -0.1240, "The Piazza, Covent Garden", "WC2E 8RF", "Covent Garden",
                  ["tour", "food", "outdoor"]),
            place("Borough Market", 51.5055, -0.0910, "8 Southwark Street", "SE1 1TL", "Southwark",
                  ["food", "tour"]),
            place("Hyde Park", 51.5027, -0.1527, "Hyde Park Corner", "W1J 7NT", "Mayfair", ["outdoor"]),
            place("Westminster Pier", 51.5016, -0.1235, "Victoria Embankment", "SW1A 2JH", "Westminster",
                  ["water"]),
        ],
        "venues": [
            place("Royal Albert Hall", 51.5009, -0.1774, "Kensington Gore", "SW7 2AP", "South Kensington",
                  ["concert", "show"]),
            place("Royal Opera House", 51.5129, -0.1222, "Bow Street", "WC2E 9DD", "Covent Garden",
                  ["opera", "concert"]),
            place("Shakespeare's Globe", 51.5081, -0.0972, "21 New Globe Walk", "SE1 9DT", "Bankside", ["show"]),
            place("Ronnie Scott's", 51.5133, -0.1317, "47 Frith Street", "W1D 4HT", "Soho",
                  ["jazz", "party", "comedy"]),
            place("St Martin-in-the-Fields", 51.5089, -0.1267, "Trafalgar Square", "WC2N 4JH", "Westminster",
                  ["concert"]),
        ],
        "hubs": [
            place("King's Cross St Pancras", 51.5308, -0.1238, "Euston Road", "N1C 4QP", "King's Cross"),
            place("Victoria Station", 51.4952, -0.1441, "Victoria Street", "SW1E 5ND", "Victoria",
                  tr=tr4("Stazione di Victoria", "Gare de Victoria", "Estación Victoria", "Bahnhof Victoria")),
            place("Southampton Cruise Terminal", 50.8970, -1.4000, "Western Docks", "SO15 1DA",
                  city="Southampton"),
            place("Dover Cruise Port", 51.1190, 1.3310, "Western Docks", "CT17 9DQ", city="Dover"),
        ],
        "airports": [
            place("Heathrow Airport (LHR)", 51.4700, -0.4543, "Hounslow", "TW6 1EW", city="Hounslow"),
            place("Gatwick Airport (LGW)", 51.1537, -0.1821, "Horley, Gatwick", "RH6 0NP", city="Crawley"),
            place("Stansted Airport (STN)", 51.8860, 0.2389, "Bassingbourn Road, Stansted", "CM24 1QW",
                  city="Stansted"),
            place("London City Airport (LCY)", 51.5048, 0.0495, "Hartmann Road", "E16 2PX", "Royal Docks"),
        ],
        "daytrips": [
            place("Windsor Castle", 51.4839, -0.6044, "", "",
                  tr=tr4("Castello di Windsor", "Château de Windsor", "Castillo de Windsor", "Schloss Windsor")),
            place("Stonehenge", 51.1789, -1.8262, "", ""),
            place("Oxford", 51.7520, -1.2577, "", ""),
            place("Bath", 51.3811, -2.3590, "", ""),
        ],
        "neighbourhoods": ["Westminster", "Soho", "South Bank", "Covent Garden"],
        "collections": [("Royal London", tr4("Londra reale", "Londres royale", "Londres real", "Königliches London")),
                        ("London after dark", tr4("Londra di notte", "Londres by night", "Londres de noche", "London bei Nacht"))],
    },
    {
        "code": "NEW_YORK", "name": "New York", "country": "United States",
        "tr": tr4("New York", "New York", "Nueva York", "New York"),
        "centre": place("Bryant Park", 40.7536, -73.9832, "W 42nd St & 6th Ave", "10018", "Midtown"),
        "landmarks": [
            place("Statue of Liberty", 40.6892, -74.0445, "Liberty Island", "10004", "Liberty Island",
                  ["ticket", "monument", "water", "view"],
                  tr4("Statua della Libertà", "Statue de la Liberté", "Estatua de la Libertad", "Freiheitsstatue")),
            place("Empire State Building", 40.7484, -73.9857, "20 W 34th St", "10001", "Midtown",
                  ["ticket", "view"]),
            place("Top of the Rock", 40.7593, -73.9794, "30 Rockefeller Plaza", "10112", "Midtown",
                  ["ticket", "view"]),
            place("Metropolitan Museum of Art", 40.7794, -73.9632, "1000 5th Ave", "10028", "Upper East Side",
                  ["ticket", "museum", "tour"]),
            place("Central Park", 40.7644, -73.9730, "Grand Army Plaza, 5th Ave & 59th St", "10022", "Midtown",
                  ["tour", "outdoor"]),
            place("Brooklyn Bridge", 40.7061, -73.9969, "Brooklyn Bridge Promenade", "10038", "Financial District",
                  ["tour", "outdoor", "water"],
                  tr4("Ponte di Brooklyn", "Pont de Brooklyn", "Puente de Brooklyn", "Brooklyn Bridge")),
            place("Times Square", 40.7580, -73.9855, "Times Square", "10036", "Midtown", ["tour"]),
            place("9/11 Memorial & Museum", 40.7115, -74.0134, "180 Greenwich St", "10007", "Financial District",
                  ["ticket", "museum", "tour"]),
            place("Greenwich Village", 40.7308, -73.9973, "Washington Square Park", "10012", "Greenwich Village",
                  ["food", "tour"]),
            place("Chelsea Market", 40.7424, -74.0060, "75 9th Ave", "10011", "Chelsea", ["food"]),
            place("Pier 83", 40.7630, -74.0010, "W 42nd St & 12th Ave", "10036", "Hell's Kitchen", ["water"]),
            place("Museum of Modern Art", 40.7614, -73.9776, "11 W 53rd St", "10019", "Midtown",
                  ["ticket", "museum"],
                  tr4("Museo d'Arte Moderna (MoMA)", "Musée d'Art moderne (MoMA)", "Museo de Arte Moderno (MoMA)", "Museum of Modern Art (MoMA)")),
        ],
        "venues": [
            place("Carnegie Hall", 40.7651, -73.9799, "881 7th Ave", "10019", "Midtown", ["concert"]),
            place("Lincoln Center", 40.7725, -73.9835, "10 Lincoln Center Plaza", "10023", "Upper West Side",
                  ["opera", "concert"]),
            place("Blue Note Jazz Club", 40.7309, -74.0006, "131 W 3rd St", "10012", "Greenwich Village",
                  ["jazz", "party"]),
            place("Radio City Music Hall", 40.7600, -73.9799, "1260 6th Ave", "10020", "Midtown",
                  ["show", "party", "concert"]),
            place("Comedy Cellar", 40.7302, -74.0005, "117 MacDougal St", "10012", "Greenwich Village",
                  ["comedy"]),
        ],
        "hubs": [
            place("Penn Station", 40.7506, -73.9935, "8th Ave & 31st St", "10001", "Midtown"),
            place("Grand Central Terminal", 40.7527, -73.9772, "89 E 42nd St", "10017", "Midtown"),
            place("Manhattan Cruise Terminal", 40.7685, -73.9950, "711 12th Ave", "10019", "Hell's Kitchen"),
            place("Brooklyn Cruise Terminal", 40.6824, -74.0138, "72 Bowne St", "11231", "Red Hook",
                  city="Brooklyn"),
        ],
        "airports": [
            place("JFK Airport", 40.6413, -73.7781, "JFK Access Road, Queens", "11430", city="Queens"),
            place("LaGuardia Airport (LGA)", 40.7769, -73.8740, "LaGuardia Road, Queens", "11371", city="Queens"),
            place("Newark Liberty Airport (EWR)", 40.6895, -74.1745, "3 Brewster Rd", "07114", city="Newark"),
        ],
        "daytrips": [
            place("Washington, D.C.", 38.9072, -77.0369, "", ""),
            place("Niagara Falls", 43.0962, -79.0377, "", "",
                  tr=tr4("Cascate del Niagara", "Chutes du Niagara", "Cataratas del Niágara", "Niagarafälle")),
            place("The Hamptons", 40.9637, -72.1848, "", ""),
            place("Philadelphia", 39.9526, -75.1652, "", "",
                  tr=tr4("Filadelfia", "Philadelphie", "Filadelfia", "Philadelphia")),
        ],
        "neighbourhoods": ["Midtown", "Greenwich Village", "Chelsea", "Financial District"],
        "collections": [("NYC skyline", tr4("Lo skyline di New York", "La skyline de New York", "El skyline de Nueva York", "Skyline von New York")),
                        ("Broadway & beyond", tr4("Broadway e dintorni", "Broadway et au-delà", "Broadway y más", "Broadway & mehr"))],
    },
    {
        "code": "DUBAI", "name": "Dubai", "country": "United Arab Emirates",
        "tr": tr4("Dubai", "Dubaï", "Dubái", "Dubai"),
        "centre": place("The Dubai Mall", 25.1985, 55.2796, "Financial Centre Road", None, "Downtown Dubai"),
        "landmarks": [
            place("Burj Khalifa", 25.1972, 55.2744, "1 Sheikh Mohammed bin Rashid Blvd", None, "Downtown Dubai",
                  ["ticket", "view", "tour"]),
            place("Dubai Aquarium & Underwater Zoo", 25.1975, 55.2791, "The Dubai Mall, Financial Centre Road",
                  None, "Downtown Dubai", ["ticket"]),
            place("Dubai Frame", 25.2354, 55.3003, "Zabeel Park, Gate 4", None, "Al Karama", ["ticket", "view"]),
            place("Museum of the Future", 25.2192, 55.2820, "Sheikh Zayed Road", None, "Trade Centre",
                  ["ticket", "museum"],
                  tr4("Museo del Futuro", "Musée du Futur", "Museo del Futuro", "Museum der Zukunft")),
            place("Al Fahidi Historical District", 25.2637, 55.2972, "Al Fahidi Street", None, "Bur Dubai",
                  ["tour", "food"],
                  tr4("Quartiere storico di Al Fahidi", "Quartier historique d'Al Fahidi", "Barrio histórico de Al Fahidi", "Historisches Viertel Al Fahidi")),
            place("Dubai Creek", 25.2631, 55.3003, "Baniyas Road", None, "Deira", ["water", "tour"]),
            place("Dubai Marina", 25.0805, 55.1403, "Dubai Marina Walk", None, "Dubai Marina",
                  ["water", "outdoor", "food"]),
            place("Aquaventure Waterpark", 25.1304, 55.1171, "Crescent Road, Palm Jumeirah", None,
                  "Palm Jumeirah", ["ticket", "water", "outdoor"]),
            place("Burj Al Arab", 25.1412, 55.1853, "Jumeirah Street", None, "Umm Suqeim",
                  ["tour", "water", "view"]),
            place("Gold Souk", 25.2706, 55.2967, "Sikkat Al Khail Road", None, "Deira", ["tour", "food"],
                  tr4("Souk dell'oro", "Souk de l'or", "Zoco del oro", "Goldsouk")),
            place("Jumeirah Mosque", 25.2341, 55.2655, "Jumeirah Beach Road", None, "Jumeirah",
                  ["tour", "monument"],
                  tr4("Moschea di Jumeirah", "Mosquée de Jumeirah", "Mezquita de Jumeirah", "Jumeirah-Moschee")),
            place("Lahbab Red Dunes", 24.8060, 55.6190, "Lahbab Desert, Al Ain Road (E66)", None, "Lahbab",
                  ["desert"],
                  tr4("Dune rosse di Lahbab", "Dunes rouges de Lahbab", "Dunas rojas de Lahbab", "Rote Dünen von Lahbab")),
            place("Dubai Desert Conservation Reserve", 24.8230, 55.6650, "Al Ain Road (E66)", None, "Margham",
                  ["desert"]),
        ],
        "venues": [
            place("Dubai Opera", 25.1956, 55.2721, "Sheikh Mohammed bin Rashid Blvd", None, "Downtown Dubai",
                  ["opera", "concert", "show"]),
            place("Coca-Cola Arena", 25.2046, 55.2616, "City Walk", None, "Al Wasl", ["concert", "party", "show"]),
            place("La Perle by Dragone", 25.1843, 55.2537, "Al Habtoor City, Sheikh Zayed Road", None,
                  "Business Bay", ["show"]),
            place("Madinat Theatre", 25.1330, 55.1853, "Souk Madinat Jumeirah", None, "Umm Suqeim",
                  ["show", "comedy"]),
            place("Zero Gravity", 25.0890, 55.1390, "Al Sufouh Road", None, "Dubai Marina", ["party", "jazz"]),
        ],
        "hubs": [
            place("Mina Rashid Cruise Terminal", 25.2670, 55.2770, "Mina Rashid", None, "Al Mina"),
            place("Union Metro Station", 25.2665, 55.3143, "Al Rigga Road", None, "Deira"),
            place("Abu Dhabi Corniche", 24.4539, 54.3773, "Corniche Road", None, city="Abu Dhabi"),
        ],
        "airports": [
            place("Dubai International Airport (DXB)", 25.2532, 55.3657, "Airport Road, Al Garhoud", None),
            place("Al Maktoum International Airport (DWC)", 24.8960, 55.1614, "Dubai South", None),
        ],
        "daytrips": [
            place("Abu Dhabi", 24.4539, 54.3773, "", ""),
            place("Sharjah", 25.3463, 55.4209, "", "", tr=tr4("Sharjah", "Charjah", "Sharjah", "Schardscha")),
            place("Hatta", 24.8039, 56.1253, "", ""),
            place("Al Ain", 24.2075, 55.7447, "", ""),
        ],
        "neighbourhoods": ["Downtown Dubai", "Dubai Marina", "Deira", "Jumeirah"],
        "collections": [("Desert adventures", tr4("Avventure nel deserto", "Aventures dans le désert", "Aventuras en el desierto", "Wüstenabenteuer")),
                        ("Dubai skyline", tr4("Lo skyline di Dubai", "La skyline de Dubaï", "El skyline de Dubái", "Skyline von Dubai"))],
    },
]

# ---------------------------------------------------------------------------------------------
# Categories (the same seven in every city) and their subcategories.
# ---------------------------------------------------------------------------------------------

CATEGORIES = [
    ("tours", "Tours", tr4("Tour", "Visites guidées", "Tours", "Touren"), [
        ("walking", "Walking tours", tr4("Tour a piedi", "Visites à pied", "Tours a pie", "Rundgänge")),
        ("guided", "Guided tours", tr4("Visite guidate", "Visites guidées", "Visitas guiadas", "Führungen")),
        ("daytrips", "Day trips", tr4("Gite di un giorno", "Excursions d'une journée", "Excursiones de un día", "Tagesausflüge")),
    ]),
    ("tickets", "Tickets & Attractions",
     tr4("Biglietti e attrazioni", "Billets et attractions", "Entradas y atracciones", "Tickets & Sehenswürdigkeiten"), [
        ("museums", "Museums", tr4("Musei", "Musées", "Museos", "Museen")),
        ("landmarks", "Landmarks & monuments", tr4("Monumenti", "Monuments", "Monumentos", "Sehenswürdigkeiten")),
        ("views", "Viewpoints & observation decks", {}),
    ]),
    ("entertainment", "Entertainment", tr4("Spettacoli", "Spectacles", "Espectáculos", "Unterhaltung"), [
        ("concerts", "Concerts", tr4("Concerti", "Concerts", "Conciertos", "Konzerte")),
        ("shows", "Shows & theatre", tr4("Spettacoli e teatro", "Spectacles et théâtre", "Espectáculos y teatro", "Shows & Theater")),
        ("nightlife", "Nightlife", {}),
    ]),
    ("activities", "Activities", tr4("Attività", "Activités", "Actividades", "Aktivitäten"), [
        ("outdoor", "Outdoor activities", tr4("Attività all'aperto", "Activités en plein air", "Actividades al aire libre", "Outdoor-Aktivitäten")),
        ("classes", "Classes & workshops", {}),
        ("cruises", "Cruises & boat trips", tr4("Crociere e gite in barca", "Croisières et balades en bateau", "Cruceros y paseos en barco", "Bootsfahrten")),
    ]),
    ("food", "Food & Drink", tr4("Cibo e vino", "Gastronomie", "Comida y bebida", "Essen & Trinken"), [
        ("foodtours", "Food tours", {}),
        ("cooking", "Cooking classes", tr4("Corsi di cucina", "Cours de cuisine", "Clases de cocina", "Kochkurse")),
        ("wine", "Wine & drinks", {}),
    ]),
    ("transfers", "Transfers", tr4("Trasferimenti", "Transferts", "Traslados", "Transfers"), [
        ("airport", "Airport transfers", tr4("Trasferimenti aeroportuali", "Transferts aéroport", "Traslados al aeropuerto", "Flughafentransfers")),
        ("private", "Private transfers", {}),
        ("shuttle", "Shuttles & station transfers", {}),
    ]),
    ("addons", "Add-ons", tr4("Extra", "Options", "Extras", "Extras"), [
        ("audio", "Audio guides & passes", tr4("Audioguide e pass", "Audioguides et pass", "Audioguías y pases", "Audioguides & Pässe")),
        ("extras", "Photos & extras", {}),
    ]),
]

TYPE_CATEGORY = {
    "TOUR": "tours", "ACTIVITY": "activities", "EVENT": "entertainment", "ATTRACTION": "tickets",
    "TRANSFER": "transfers", "AIRPORT_TRANSFER": "transfers", "ADD_ON": "addons",
}

# ---------------------------------------------------------------------------------------------
# Product name templates: (English, translations, place source, place kind, primary subcategory,
# optional (secondary category, its subcategory), extra tags). {lm} is the place, {lm2} a second
# place, {city} the city; translations use the place's translated name where there is one.
# ---------------------------------------------------------------------------------------------


def T(en, tr, source, kind, sub, secondary=None, tags=(), shuttle=False):
    return {"en": en, "tr": tr, "source": source, "kind": kind, "sub": sub, "secondary": secondary,
            "tags": list(tags), "shuttle": shuttle}


TEMPLATES = {
    "TOUR": [
        T("{lm} guided tour",
          tr4("Visita guidata: {lm}", "Visite guidée : {lm}", "Visita guiada: {lm}", "Führung: {lm}"),
          "landmarks", "tour", "guided"),
        T("Skip-the-line {lm} tour with a local guide",
          tr4("{lm}: tour salta fila con guida locale", "{lm} : visite coupe-file avec guide local",
              "{lm}: tour sin colas con guía local", "{lm}: Tour ohne Anstehen mit lokalem Guide"),
          "landmarks", "ticket", "guided", ("tickets", "landmarks"), ["skip-the-line"]),
        T("Small-group walking tour around {lm}",
          tr4("Tour a piedi in piccolo gruppo: {lm}", "Visite à pied en petit groupe : {lm}",
              "Tour a pie en grupo reducido: {lm}", "Rundgang in kleiner Gruppe: {lm}"),
          "landmarks", "tour", "walking", None, ["small-group"]),
        T("{city} by night: evening walk from {lm}",
          tr4("{city} di notte: passeggiata serale da {lm}", "{city} by night : balade du soir depuis {lm}",
              "{city} de noche: paseo nocturno desde {lm}", "{city} bei Nacht: Abendspaziergang ab {lm}"),
          "landmarks", "tour", "walking"),
        T("Private tour of {lm} and {lm2}",
          tr4("Tour privato: {lm} e {lm2}", "Visite privée : {lm} et {lm2}", "Tour privado: {lm} y {lm2}",
              "Private Tour: {lm} und {lm2}"),
          "landmarks", "tour", "guided", None, ["private"]),
        T("Food and history walk near {lm}",
          tr4("Passeggiata tra cibo e storia vicino a {lm}", "Balade gourmande et historique près de {lm}",
              "Paseo gastronómico e histórico cerca de {lm}", "Kulinarischer Geschichtsspaziergang bei {lm}"),
          "landmarks", "food", "walking", ("food", "foodtours"), ["food"]),
        T("Day trip from {city} to {lm}",
          tr4("Gita di un giorno da {city} a {lm}", "Excursion d'une journée de {city} à {lm}",
              "Excursión de un día de {city} a {lm}", "Tagesausflug von {city} nach {lm}"),
          "daytrips", None, "daytrips", None, ["day-trip"]),
    ],
    "ACTIVITY": [
        T("Sunset cruise past {lm}",
          tr4("Crociera al tramonto vicino a {lm}", "Croisière au coucher du soleil près de {lm}",
              "Crucero al atardecer junto a {lm}", "Sonnenuntergangs-Bootsfahrt bei {lm}"),
          "landmarks", "water", "cruises", None, ["cruise"]),
        T("Cooking class near {lm} with tasting",
          tr4("Corso di cucina vicino a {lm} con degustazione", "Cours de cuisine près de {lm} avec dégustation",
              "Clase de cocina cerca de {lm} con degustación", "Kochkurs bei {lm} mit Verkostung"),
          "landmarks", "food", "classes", ("food", "cooking"), ["cooking"]),
        T("E-bike adventure from {lm}",
          tr4("Avventura in e-bike da {lm}", "Aventure en vélo électrique depuis {lm}",
              "Aventura en bici eléctrica desde {lm}", "E-Bike-Abenteuer ab {lm}"),
          "landmarks", "outdoor", "outdoor", None, ["bike"]),
        T("Photography walk around {lm}",
          tr4("Passeggiata fotografica intorno a {lm}", "Balade photo autour de {lm}",
              "Paseo fotográfico por {lm}", "Fotospaziergang rund um {lm}"),
          "landmarks", "tour", "classes", ("tours", "walking"), ["photography"]),
        T("Wine tasting experience near {lm}",
          tr4("Degustazione di vini vicino a {lm}", "Dégustation de vins près de {lm}",
              "Cata de vinos cerca de {lm}", "Weinprobe bei {lm}"),
          "landmarks", "food", "classes", ("food", "wine"), ["wine", "adults-only"]),
        T("Segway ride around {lm}",
          tr4("Giro in Segway intorno a {lm}", "Balade en Segway autour de {lm}",
              "Paseo en Segway por {lm}", "Segway-Tour rund um {lm}"),
          "landmarks", "outdoor", "outdoor"),
        T("Desert safari at {lm} with BBQ dinner",
          tr4("Safari nel deserto a {lm} con cena barbecue", "Safari dans le désert à {lm} avec dîner barbecue",
              "Safari por el desierto en {lm} con cena barbacoa", "Wüstensafari in {lm} mit Grillabendessen"),
          "landmarks", "desert", "outdoor", None, ["desert", "pick-up"]),
        T("Dune bashing and camel ride at {lm}",
          tr4("Dune bashing e giro in cammello a {lm}", "Dune bashing et balade à dos de chameau à {lm}",
              "Dune bashing y paseo en camello en {lm}", "Dünenfahrt und Kamelritt in {lm}"),
          "landmarks", "desert", "outdoor", None, ["desert"]),
    ],
    "EVENT": [
        T("Classical concert at {lm}",
          tr4("Concerto di musica classica a {lm}", "Concert de musique classique à {lm}",
              "Concierto de música clásica en {lm}", "Klassisches Konzert in {lm}"),
          "venues", "concert", "concerts", None, ["classical"]),
        T("Opera gala at {lm}",
          tr4("Gala d'opera a {lm}", "Gala d'opéra à {lm}", "Gala de ópera en {lm}", "Operngala in {lm}"),
          "venues", "opera", "concerts", None, ["opera"]),
        T("Jazz night at {lm}",
          tr4("Serata jazz a {lm}", "Soirée jazz à {lm}", "Noche de jazz en {lm}", "Jazzabend in {lm}"),
          "venues", "jazz", "nightlife", None, ["jazz"]),
        T("{city} musical: evening show at {lm}",
          tr4("Musical a {city}: spettacolo serale a {lm}", "Comédie musicale à {city} : spectacle du soir à {lm}",
              "Musical en {city}: espectáculo nocturno en {lm}", "Musical in {city}: Abendshow in {lm}"),
          "venues", "show", "shows", None, ["musical"]),
        T("Candlelight concert: Vivaldi's Four Seasons at {lm}",
          tr4("Concerto a lume di candela: Le quattro stagioni di Vivaldi a {lm}",
              "Concert à la bougie : Les Quatre Saisons de Vivaldi à {lm}",
              "Concierto a la luz de las velas: Las cuatro estaciones de Vivaldi en {lm}",
              "Konzert bei Kerzenschein: Vivaldis Vier Jahreszeiten in {lm}"),
          "venues", "concert", "concerts", None, ["classical", "candlelight"]),
        T("New Year's Eve party at {lm}",
          tr4("Festa di Capodanno a {lm}", "Soirée du Nouvel An à {lm}", "Fiesta de Nochevieja en {lm}",
              "Silvesterparty in {lm}"),
          "venues", "party", "nightlife", None, ["new-years-eve", "adults-only"]),
        T("Stand-up comedy night at {lm}",
          tr4("Serata di stand-up comedy a {lm}", "Soirée stand-up à {lm}", "Noche de monólogos en {lm}",
              "Stand-up-Comedy-Abend in {lm}"),
          "venues", "comedy", "shows", None, ["comedy"]),
    ],
    "ATTRACTION": [
        T("{lm} entry ticket",
          tr4("Biglietto d'ingresso: {lm}", "Billet d'entrée : {lm}", "Entrada: {lm}", "Eintrittskarte: {lm}"),
          "landmarks", "ticket", None),
        T("{lm}: skip-the-line ticket",
          tr4("{lm}: biglietto salta fila", "{lm} : billet coupe-file", "{lm}: entrada sin colas",
              "{lm}: Ticket ohne Anstehen"),
          "landmarks", "ticket", None, None, ["skip-the-line"]),
        T("{lm} ticket with audio guide",
          tr4("{lm}: biglietto con audioguida", "{lm} : billet avec audioguide", "{lm}: entrada con audioguía",
              "{lm}: Ticket mit Audioguide"),
          "landmarks", "ticket", None, ("addons", "audio"), ["audio-guide"]),
        T("{lm} timed-entry ticket",
          tr4("{lm}: biglietto con ingresso a orario", "{lm} : billet à horaire fixe", "{lm}: entrada con horario",
              "{lm}: Zeitfenster-Ticket"),
          "landmarks", "ticket", None),
        T("{lm}: reserved entrance and guided visit",
          tr4("{lm}: ingresso riservato e visita guidata", "{lm} : entrée réservée et visite guidée",
              "{lm}: entrada reservada y visita guiada", "{lm}: reservierter Eintritt und Führung"),
          "landmarks", "ticket", None, ("tours", "guided"), ["guided"]),
    ],
    "TRANSFER": [
        T("Private transfer from {lm} to {lm2}",
          tr4("Trasferimento privato da {lm} a {lm2}", "Transfert privé de {lm} à {lm2}",
              "Traslado privado de {lm} a {lm2}", "Privattransfer von {lm} nach {lm2}"),
          "hubs", None, "private", None, ["private"]),
        T("Shared shuttle from {lm} to {lm2}",
          tr4("Navetta condivisa da {lm} a {lm2}", "Navette partagée de {lm} à {lm2}",
              "Lanzadera compartida de {lm} a {lm2}", "Shuttle von {lm} nach {lm2}"),
          "hubs", None, "shuttle", None, ["shared"], shuttle=True),
        T("Chauffeured transfer: {lm} to {lm2}",
          tr4("Trasferimento con autista: da {lm} a {lm2}", "Transfert avec chauffeur : de {lm} à {lm2}",
              "Traslado con chófer: de {lm} a {lm2}", "Transfer mit Chauffeur: {lm} nach {lm2}"),
          "hubs", None, "private", None, ["private", "chauffeur"]),
        T("Luxury van transfer from {lm} to {lm2}",
          tr4("Trasferimento in van di lusso da {lm} a {lm2}", "Transfert en van de luxe de {lm} à {lm2}",
              "Traslado en furgoneta de lujo de {lm} a {lm2}", "Luxus-Van-Transfer von {lm} nach {lm2}"),
          "hubs", None, "private", None, ["private", "van"]),
    ],
    "AIRPORT_TRANSFER": [
        T("Private transfer from {lm} to central {city}",
          tr4("Trasferimento privato da {lm} al centro di {city}", "Transfert privé de {lm} au centre de {city}",
              "Traslado privado de {lm} al centro de {city}", "Privattransfer von {lm} ins Zentrum von {city}"),
          "airports", None, "airport", None, ["private"]),
        T("Shared shuttle: {lm} to {city} hotels",
          tr4("Navetta condivisa: da {lm} agli hotel di {city}", "Navette partagée : de {lm} aux hôtels de {city}",
              "Lanzadera compartida: de {lm} a los hoteles de {city}", "Shuttle: {lm} zu Hotels in {city}"),
          "airports", None, "airport", ("transfers", "shuttle"), ["shared"], shuttle=True),
        T("Meet-and-greet transfer from {lm} to {lm2}",
          tr4("Trasferimento con accoglienza da {lm} a {lm2}", "Transfert avec accueil de {lm} à {lm2}",
              "Traslado con recepción de {lm} a {lm2}", "Transfer mit Empfang von {lm} nach {lm2}"),
          "airports", None, "airport", None, ["meet-and-greet"]),
        T("Private transfer from central {city} to {lm}",
          tr4("Trasferimento privato dal centro di {city} a {lm}", "Transfert privé du centre de {city} à {lm}",
              "Traslado privado del centro de {city} a {lm}", "Privattransfer vom Zentrum von {city} nach {lm}"),
          "airports", None, "airport", ("transfers", "private"), ["private", "departure"]),
    ],
    "ADD_ON": [
        T("{lm} audio guide app",
          tr4("App audioguida: {lm}", "Application audioguide : {lm}", "App de audioguía: {lm}",
              "Audioguide-App: {lm}"),
          "landmarks", "ticket", "audio", None, ["audio-guide"]),
        T("Souvenir photo package at {lm}",
          tr4("Pacchetto foto ricordo: {lm}", "Forfait photos souvenir : {lm}", "Paquete de fotos de recuerdo: {lm}",
              "Erinnerungsfoto-Paket: {lm}"),
          "landmarks", "tour", "extras", None, ["photos"]),
        T("{city} public transport pass ({lm})",
          tr4("Abbonamento ai trasporti pubblici di {city} ({lm})", "Pass transports publics de {city} ({lm})",
              "Abono de transporte público de {city} ({lm})", "ÖPNV-Pass {city} ({lm})"),
          "passes", None, "audio", None, ["pass"]),
        T("Fast-track upgrade for {lm}",
          tr4("Upgrade accesso rapido: {lm}", "Option accès rapide : {lm}", "Mejora de acceso rápido: {lm}",
              "Fast-Track-Upgrade: {lm}"),
          "landmarks", "ticket", "extras", None, ["skip-the-line"]),
        T("Lunch voucher near {lm}",
          tr4("Buono pranzo vicino a {lm}", "Bon déjeuner près de {lm}", "Vale de almuerzo cerca de {lm}",
              "Mittagessen-Gutschein bei {lm}"),
          "landmarks", "food", "extras", ("food", "foodtours"), ["food"]),
    ],
}

PASS_DURATIONS = [
    place("24 hours", 0, 0, "", "", tr=tr4("24 ore", "24 heures", "24 horas", "24 Stunden")),
    place("48 hours", 0, 0, "", "", tr=tr4("48 ore", "48 heures", "48 horas", "48 Stunden")),
    place("72 hours", 0, 0, "", "", tr=tr4("72 ore", "72 heures", "72 horas", "72 Stunden")),
]

# Products per (type, city): 4 everywhere, a few more where the city is strong.
EXTRA = {("TOUR", "ROME"), ("TOUR", "PARIS"), ("ATTRACTION", "PARIS"), ("ATTRACTION", "NEW_YORK"),
         ("EVENT", "LONDON"), ("EVENT", "NEW_YORK"), ("ACTIVITY", "DUBAI")}

# ---------------------------------------------------------------------------------------------
# Variants: (name, price multiplier, tags, options) per product type.
# ---------------------------------------------------------------------------------------------

VARIANTS = {
    "TOUR": [
        ("Group tour in English", 1.0, ["english"], {}),
        ("Group tour in Spanish", 0.95, ["spanish"], {}),
        ("Small group (max 10) in English", 1.35, ["english", "small-group"], {"pax": (1, 10)}),
        ("Tour with hotel pick-up", 1.7, ["pick-up"], {}),
        ("Private tour (up to 4 people)", 3.2, ["private"], {"group": [4], "small": True}),
    ],
    "ACTIVITY": [
        ("Standard session", 1.0, [], {}),
        ("Morning session", 0.9, ["morning"], {}),
        ("Sunset session", 1.2, ["sunset"], {}),
        ("Premium session with extras", 1.45, ["premium"], {}),
        ("Private session (up to 4 people)", 3.0, ["private"], {"group": [4], "small": True}),
    ],
    "EVENT": [
        ("Standard seating", 1.0, [], {}),
        ("Premium seating", 1.6, ["premium"], {}),
        ("VIP seating with a drink", 2.3, ["vip"], {"small": True}),
        ("Standing", 0.7, ["standing"], {}),
    ],
    "ATTRACTION": [
        ("Standard entry", 1.0, [], {}),
        ("Entry with audio guide", 1.25, ["audio-guide"], {}),
        ("Priority entry", 1.5, ["skip-the-line"], {}),
        ("Entry with guided visit", 1.9, ["guided"], {}),
        ("Late opening entry", 1.1, ["evening"], {}),
    ],
    "TRANSFER": [
        ("Sedan (up to 3 passengers)", 1.0, ["sedan"], {"group": [3]}),
        ("Standard car (up to 4 passengers)", 1.15, ["car"], {"group": [4]}),
        ("Minivan (up to 8 passengers)", 1.6, ["minivan"], {"group": [8]}),
        ("Sedan or minivan", 1.05, ["sedan", "minivan"], {"group": [3, 8]}),
        ("Business car or van", 1.3, ["business"], {"group": [4, 8]}),
    ],
    "SHUTTLE": [
        ("Shared shuttle, one way", 1.0, ["one-way"], {}),
        ("Shared shuttle, return", 1.8, ["return"], {}),
        ("Shared shuttle with extra luggage", 1.25, ["luggage"], {}),
    ],
    "ADD_ON": [
        ("Standard", 1.0, [], {}),
        ("Premium", 1.5, ["premium"], {}),
        ("Family pack", 2.4, ["family"], {"pax": (2, 6)}),
    ],
}
VARIANTS["AIRPORT_TRANSFER"] = VARIANTS["TRANSFER"]

ADULT_PRICE = {  # EUR, per adult (or per smallest group for PER_GROUP)
    "TOUR": (25, 90), "DAYTRIP": (85, 180), "ACTIVITY": (30, 140), "EVENT": (25, 110),
    "ATTRACTION": (12, 60), "TRANSFER": (55, 160), "AIRPORT_TRANSFER": (45, 130), "SHUTTLE": (12, 35),
    "ADD_ON": (4, 30),
}
DURATIONS = {
    "TOUR": [90, 120, 150, 180, 240], "DAYTRIP": [540, 600, 660, 720], "ACTIVITY": [60, 90, 120, 180, 240],
    "EVENT": [60, 90, 120, 150, 180], "ATTRACTION": [60, 90, 120, 180], "TRANSFER": [30, 45, 60, 90, 120],
    "AIRPORT_TRANSFER": [30, 45, 60, 75, 90], "ADD_ON": [30, 60, 120, 240, 480],
}
START_TIMES = {
    "TOUR": ["08:30", "09:00", "10:00", "11:00", "13:30", "14:00", "15:00", "16:30", "18:00", "20:30"],
    "DAYTRIP": ["07:00", "07:30", "08:00"],
    "ACTIVITY": ["09:00", "10:30", "12:00", "15:00", "17:30", "18:30"],
    "EVENT": ["19:00", "19:30", "20:00", "21:00"],
    "ATTRACTION": ["09:00", "10:00", "11:00", "12:00", "13:00", "14:00", "15:00", "16:00", "17:00"],
    "TRANSFER": ["06:00", "08:00", "10:00", "12:00", "14:00", "16:00", "18:00", "20:00", "22:00"],
    "AIRPORT_TRANSFER": ["05:30", "07:00", "09:00", "11:00", "13:00", "15:00", "17:00", "19:00", "21:00", "23:00"],
    "ADD_ON": ["09:00", "10:00", "12:00", "14:00"],
}

SUMMARY = {
    "TOUR": ["Explore {lm} with an expert guide and hear the stories behind {city}'s most famous sights.",
             "See {lm} at an easy pace with a licensed guide, small groups and plenty of time for photos."],
    "DAYTRIP": ["Leave {city} behind for a day: comfortable coach, a local guide and free time in {lm}."],
    "ACTIVITY": ["A hands-on experience near {lm}: friendly instructors, all equipment included.",
                 "Try something new in {city}: a relaxed, small-group activity starting at {lm}."],
    "EVENT": ["An evening of live entertainment at {lm}: pick your date and book your seat.",
              "Enjoy a memorable night out in {city} at {lm}, one of the city's favourite venues."],
    "ATTRACTION": ["Visit {lm} with a mobile ticket and spend as long as you like inside.",
                   "Your entry to {lm}, one of {city}'s must-see attractions, booked in advance."],
    "TRANSFER": ["A comfortable, punctual ride from {lm} to {lm2} with a professional driver.",
                 "Door-to-door transfer between {lm} and {lm2}: fixed price, no surprises."],
    "AIRPORT_TRANSFER": ["Start your trip stress-free: your driver tracks your flight and waits at {lm}.",
                         "Fixed-price transfer between {lm} and {city}, with luggage included."],
    "ADD_ON": ["A handy extra for your visit to {city}: {lm}.",
               "Add this to your booking and make the most of your time in {city}."],
}
SUMMARY_TR = {
    "TOUR": tr4("Scopri {city} con una guida esperta: storia, aneddoti e i luoghi più famosi.",
                "Découvrez {city} avec un guide expert : histoire, anecdotes et sites incontournables.",
                "Descubre {city} con un guía experto: historia, anécdotas y los lugares más famosos.",
                "Entdecken Sie {city} mit einem erfahrenen Guide: Geschichte, Anekdoten und berühmte Orte."),
    "ACTIVITY": tr4("Un'esperienza pratica e divertente a {city}, adatta a tutti.",
                    "Une expérience ludique et pratique à {city}, pour tous.",
                    "Una experiencia práctica y divertida en {city}, para todos.",
                    "Ein praktisches und unterhaltsames Erlebnis in {city} für alle."),
    "EVENT": tr4("Una serata di spettacolo dal vivo a {city}: scegli la data e prenota il tuo posto.",
                 "Une soirée de spectacle vivant à {city} : choisissez la date et réservez votre place.",
                 "Una noche de espectáculo en vivo en {city}: elige la fecha y reserva tu plaza.",
                 "Ein Abend mit Live-Unterhaltung in {city}: Datum wählen und Platz reservieren."),
    "ATTRACTION": tr4("Ingresso a una delle attrazioni più amate di {city}, con biglietto sul cellulare.",
                      "Entrée à l'une des attractions préférées de {city}, billet sur mobile.",
                      "Entrada a una de las atracciones favoritas de {city}, con entrada en el móvil.",
                      "Eintritt zu einer der beliebtesten Sehenswürdigkeiten in {city}, mit Handyticket."),
    "TRANSFER": tr4("Trasferimento comodo e puntuale a {city}, con autista professionista.",
                    "Un transfert confortable et ponctuel à {city}, avec chauffeur professionnel.",
                    "Traslado cómodo y puntual en {city}, con conductor profesional.",
                    "Bequemer, pünktlicher Transfer in {city} mit professionellem Fahrer."),
    "AIRPORT_TRANSFER": tr4("Dall'aeroporto al tuo hotel a {city} senza stress: l'autista segue il tuo volo.",
                            "De l'aéroport à votre hôtel à {city} sans stress : le chauffeur suit votre vol.",
                            "Del aeropuerto a tu hotel en {city} sin estrés: el conductor sigue tu vuelo.",
                            "Stressfrei vom Flughafen zum Hotel in {city}: Der Fahrer verfolgt Ihren Flug."),
    "ADD_ON": tr4("Un extra utile per completare la tua visita a {city}.",
                  "Un petit plus pour compléter votre visite de {city}.",
                  "Un extra útil para completar tu visita a {city}.",
                  "Ein praktisches Extra für Ihren Besuch in {city}."),
}
HIGHLIGHTS = {
    "TOUR": ["Skip the crowds with a licensed local guide", "Hear the stories behind {lm}",
             "Small groups for a personal experience", "Great photo stops along the way",
             "Tips on where to eat afterwards"],
    "ACTIVITY": ["All equipment included", "Friendly, experienced instructors", "Suitable for beginners",
                 "Unforgettable views of {lm}", "Small groups"],
    "EVENT": ["Live performance in a stunning venue", "Choose your seat category", "Doors open 30 minutes early",
              "Mobile ticket accepted", "Bar open before the show"],
    "ATTRACTION": ["Mobile ticket, no printing needed", "Explore {lm} at your own pace",
                   "Reserved time slot", "Free cancellation on most dates", "Family friendly"],
    "TRANSFER": ["Fixed price per vehicle", "Professional, licensed driver", "Door-to-door service",
                 "Luggage included", "Free waiting time"],
    "AIRPORT_TRANSFER": ["Driver monitors your flight", "Meet and greet in the arrivals hall",
                         "60 minutes of free waiting time", "Child seats on request", "Fixed price, no surprises"],
    "ADD_ON": ["Instant delivery by email", "Works with any booking", "Great value", "No queues"],
}
INCLUSIONS = {
    "TOUR": ["Licensed guide", "Headsets for groups over 10", "Entry tickets where stated"],
    "ACTIVITY": ["Instructor", "Equipment", "Bottled water"],
    "EVENT": ["Admission to the performance", "Seat in the chosen category"],
    "ATTRACTION": ["Entry ticket", "Access to permanent exhibitions"],
    "TRANSFER": ["Private vehicle and driver", "Tolls and taxes", "Luggage"],
    "AIRPORT_TRANSFER": ["Vehicle and driver", "Meet and greet", "Flight monitoring"],
    "ADD_ON": ["The selected extra"],
}
EXCLUSIONS = {
    "TOUR": ["Gratuities", "Food and drinks"],
    "ACTIVITY": ["Hotel pick-up", "Gratuities"],
    "EVENT": ["Food and drinks", "Cloakroom"],
    "ATTRACTION": ["Temporary exhibitions", "Guided tour"],
    "TRANSFER": ["Gratuities", "Extra stops"],
    "AIRPORT_TRANSFER": ["Gratuities", "Waiting beyond 60 minutes"],
    "ADD_ON": ["Entry tickets"],
}

# ---------------------------------------------------------------------------------------------

FULL_NAME = {"id": "fullName", "name": "Full name", "dataType": "STRING", "level": "PRIMARY_CUSTOMER",
             "validation": {"required": True, "minLength": 2, "maxLength": 80, "regex": None,
                            "minValue": None, "maxValue": None, "values": None}}
EMAIL = {"id": "email", "name": "Email", "dataType": "STRING", "level": "PRIMARY_CUSTOMER",
         "validation": {"required": True, "minLength": None, "maxLength": 120,
                        "regex": r"^[^@\s]+@[^@\s]+\.[^@\s]+$",
                        "minValue": None, "maxValue": None, "values": None}}
PHONE = {"id": "phone", "name": "Phone number", "dataType": "STRING", "level": "PRIMARY_CUSTOMER",
         "validation": {"required": False, "minLength": None, "maxLength": None, "regex": r"^\+?[0-9 ]{6,20}$",
                        "minValue": None, "maxValue": None, "values": None}}
FLIGHT = {"id": "flightNumber", "name": "Flight number", "dataType": "STRING", "level": "PRIMARY_CUSTOMER",
          "validation": {"required": True, "minLength": None, "maxLength": None,
                         "regex": r"^[A-Z0-9]{2}[0-9]{1,4}$",
                         "minValue": None, "maxValue": None, "values": None}}
AGE = {"id": "age", "name": "Age", "dataType": "STRING", "level": "PRIMARY_CUSTOMER",
       "validation": {"required": False, "minLength": None, "maxLength": None, "regex": None,
                      "minValue": 8, "maxValue": 99, "values": None}}
LANGUAGE = {"id": "language", "name": "Preferred language", "dataType": "STRING", "level": "PRIMARY_CUSTOMER",
            "validation": {"required": False, "minLength": None, "maxLength": None, "regex": None,
                           "minValue": None, "maxValue": None, "values": ["EN", "IT", "FR"]}}

CANCELLATION = [((True, 1440), 40), ((True, 2880), 20), ((True, 0), 15), ((False, None), 25)]
RESCHEDULE = [((True, 1440), 35), ((True, 2880), 15), ((True, 0), 15), ((False, None), 35)]

EVENT_MONTHS = [(2026, 12), (2027, 1), (2027, 2), (2027, 3), (2027, 4), (2027, 5), (2027, 6)]
DAYS_IN = {(2026, 12): 31, (2027, 1): 31, (2027, 2): 28, (2027, 3): 31, (2027, 4): 30, (2027, 5): 31,
           (2027, 6): 30}


def slugify(text):
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


class Generator:
    def __init__(self, seed=SEED):
        self.rng = random.Random(seed)
        self.next_product = 1001
        self.next_variant = 50001
        self.names = set()
        self.cat_ids = {}   # (city, key) -> id
        self.sub_ids = {}   # (city, cat key, sub key) -> id
        self.coll_ids = {}  # city -> [ids]

    # -- small helpers ------------------------------------------------------------------------

    def weighted(self, options):
        total = sum(w for _, w in options)
        r = self.rng.uniform(0, total)
        for value, w in options:
            r -= w
            if r <= 0:
                return value
        return options[-1][0]

    def location(self, city, p, jitter=True):
        d = (lambda: self.rng.uniform(-0.0006, 0.0006)) if jitter else (lambda: 0.0)
        return {
            "latitude": round(p["lat"] + d(), 6),
            "longitude": round(p["lon"] + d(), 6),
            "address": p["address"] or p["name"],
            "city": p["city"] or city["name"],
            "postalCode": p["postal"],
            "country": p["country"] or city["country"],
        }

    @staticmethod
    def local_name(p, lang):
        return p["tr"].get(lang, p["name"]) if lang else p["name"]

    def price_triple(self, price):
        price = round(price * 2) / 2  # x.00 / x.50
        price = max(price, 1.0)
        original = price
        if self.rng.random() < 0.35:
            original = round(price * self.rng.uniform(1.1, 1.3) * 2) / 2
        net = round(price * self.rng.uniform(0.72, 0.86), 2)
        if net >= price:
            net = round(price - 0.5, 2)
        return price, max(original, price), net

    # -- taxonomy -----------------------------------------------------------------------------

    def taxonomy(self):
        cities, categories, subcategories, collections = [], [], [], []
        for ci, city in enumerate(CITIES, start=1):
            cities.append({
                "code": city["code"], "name": city["name"], "timeZone": TIME_ZONES[city["code"]],
                "imageUrl": f"{IMAGE_BASE}/cities/{slugify(city['name'])}.jpg",
                "translations": {lang: {"name": n} for lang, n in city["tr"].items()},
            })
            for ki, (key, name, tr, subs) in enumerate(CATEGORIES, start=1):
                cid = f"{ci}{ki}"
                self.cat_ids[(city["code"], key)] = cid
                categories.append({"id": cid, "name": name, "cityCode": city["code"],
                                   "translations": {lang: {"name": n} for lang, n in tr.items()}})
                for si, (skey, sname, str_) in enumerate(subs, start=1):
                    sid = f"{ci}{ki}{si}"
                    self.sub_ids[(city["code"], key, skey)] = sid
                    subcategories.append({"id": sid, "name": sname, "categoryId": cid,
                                          "translations": {lang: {"name": n} for lang, n in str_.items()}})
            ids = []
            for n, (name, tr) in enumerate(city["collections"], start=1):
                coll_id = f"{ci}90{n}"
                ids.append(coll_id)
                collections.append({"id": coll_id, "name": name, "cityCode": city["code"],
                                    "translations": {lang: {"name": t} for lang, t in tr.items()}})
            self.coll_ids[city["code"]] = ids
        return cities, categories, subcategories, collections

    # -- products -----------------------------------------------------------------------------

    def candidates(self, ptype, city, template):
        """Every (place, second place) the template can use in the city."""
        src = template["source"]
        if src == "landmarks":
            places = [p for p in city["landmarks"] if template["kind"] in p["kinds"]]
        elif src == "venues":
            places = [p for p in city["venues"] if template["kind"] in p["kinds"]]
        elif src == "daytrips":
            places = city["daytrips"]
        elif src == "passes":
            places = PASS_DURATIONS
        elif src == "hubs":
            places = city["hubs"]
        elif src == "airports":
            places = city["airports"]
        else:
            raise ValueError(src)
        out = []
        for p in places:
            if "{lm2}" in template["en"]:
                if src == "landmarks":
                    seconds = [q for q in places if q is not p]
                else:  # transfers: hub or airport to a landmark or the centre, never to itself
                    seconds = [city["centre"]] + [q for q in city["landmarks"] if "tour" in q["kinds"]][:4]
                for q in seconds:
                    out.append((p, q))
            else:
                out.append((p, None))
        return out

    def name_of(self, template, city, p, q, lang=None):
        text = template["tr"][lang] if lang else template["en"]
        return text.format(lm=self.local_name(p, lang),
                           lm2=self.local_name(q, lang) if q else "",
                           city=city["tr"].get(lang, city["name"]) if lang else city["name"])

    def products(self):
        out = []
        for ptype in ["TOUR", "ACTIVITY", "EVENT", "ATTRACTION", "TRANSFER", "AIRPORT_TRANSFER", "ADD_ON"]:
            for city in CITIES:
                count = 4 + (1 if (ptype, city["code"]) in EXTRA else 0)
                templates = [t for t in TEMPLATES[ptype] if self.candidates(ptype, city, t)]
                self.rng.shuffle(templates)
                made = 0
                if ptype == "EVENT" and city["code"] == "LONDON":
                    out.append(self.seatmap_product(city))
                    made += 1
                k = 0
                while made < count:
                    template = templates[k % len(templates)]
                    k += 1
                    options = self.candidates(ptype, city, template)
                    self.rng.shuffle(options)
                    for p, q in options:
                        name = self.name_of(template, city, p, q)
                        if name not in self.names:
                            out.append(self.product(ptype, city, template, p, q))
                            made += 1
                            break
                    if k > 200:
                        raise SystemExit(f"not enough distinct names for {ptype} in {city['code']}")
        return out

    def product(self, ptype, city, template, p, q):
        rng = self.rng
        pid = str(self.next_product)
        self.next_product += 1
        name = self.name_of(template, city, p, q)
        self.names.add(name)
        kind = "DAYTRIP" if template["source"] == "daytrips" else ptype
        city_slug = slugify(city["name"])
        url = f"/{city_slug}/{slugify(name)}-{pid}"
        canonical = f"{SITE_BASE}/en{url}"

        # Where it starts and ends.
        if template["source"] in ("daytrips", "passes"):
            start, end = self.location(city, city["centre"]), None
        elif ptype == "AIRPORT_TRANSFER" and "departure" in template["tags"]:  # to the airport
            start, end = self.location(city, city["centre"]), self.location(city, p, jitter=False)
        elif ptype == "AIRPORT_TRANSFER":
            start = self.location(city, p, jitter=False)
            end = self.location(city, q if q else city["centre"])
        elif q is not None:
            start, end = self.location(city, p), self.location(city, q)
        else:
            start = self.location(city, p)
            end = None
            if ptype == "TOUR" and rng.random() < 0.3:
                others = [x for x in city["landmarks"] if x is not p and "tour" in x["kinds"]]
                end = self.location(city, rng.choice(others))

        # Categories.
        primary_key = TYPE_CATEGORY[ptype]
        primary_cat = self.cat_ids[(city["code"], primary_key)]
        sub_key = template["sub"]
        if sub_key is None:  # attractions: by what the place is
            sub_key = "museums" if "museum" in p["kinds"] else "views" if "view" in p["kinds"] else "landmarks"
        subs = [self.sub_ids[(city["code"], primary_key, sub_key)]]
        secondary = []
        if template["secondary"]:  # another category, or (same category) just a second subcategory
            skey, ssub = template["secondary"]
            if skey != primary_key:
                secondary.append(self.cat_ids[(city["code"], skey)])
            if skey == primary_key or rng.random() < 0.8:
                subs.append(self.sub_ids[(city["code"], skey, ssub)])
        elif rng.random() < 0.2:
            other = rng.choice([c[0] for c in CATEGORIES if c[0] != primary_key and c[0] != "addons"])
            secondary.append(self.cat_ids[(city["code"], other)])
        if len(subs) == 1 and rng.random() < 0.3:
            siblings = [s[0] for c in CATEGORIES if c[0] == primary_key for s in c[3] if s[0] != sub_key]
            subs.append(self.sub_ids[(city["code"], primary_key, rng.choice(siblings))])

        # Collections.
        collection_ids, primary_collection = [], None
        if rng.random() < 0.35:
            ids = self.coll_ids[city["code"]]
            collection_ids = rng.sample(ids, rng.choice([1, 1, 2]))
            primary_collection = collection_ids[0] if rng.random() < 0.8 else None

        # Content.
        fmt = {"lm": p["name"], "lm2": q["name"] if q else city["name"], "city": city["name"]}
        summary = rng.choice(SUMMARY[kind]).format(**fmt)
        highlights = [h.format(**fmt) for h in rng.sample(HIGHLIGHTS[ptype], 3)]
        inclusions = INCLUSIONS[ptype]
        exclusions = EXCLUSIONS[ptype]
        mobile = rng.random() < (0.95 if ptype in ("EVENT", "ATTRACTION") else 0.75)
        delivery = ("<p>Your mobile ticket arrives by email right after booking; show it on your phone.</p>"
                    if mobile else "<p>Print the voucher you receive by email and bring it with you.</p>")
        content = {
            "shortSummary": summary,
            "summaryHtml": f"<p>{summary}</p>",
            "highlights": "\n".join(highlights),
            "highlightsHtml": "<ul>" + "".join(f"<li>{h}</li>" for h in highlights) + "</ul>",
            "inclusions": "\n".join(inclusions),
            "inclusionsHtml": "<ul>" + "".join(f"<li>{i}</li>" for i in inclusions) + "</ul>",
            "exclusions": "\n".join(exclusions),
            "exclusionsHtml": "<ul>" + "".join(f"<li>{e}</li>" for e in exclusions) + "</ul>",
            "faqHtml": "<h3>Is it wheelchair accessible?</h3><p>Please contact us before booking.</p>",
            "ticketDeliveryInfoHtml": delivery,
        }

        # Translations: about a third of the products, 1-3 languages.
        translations = {}
        if rng.random() < 0.34:
            for lang in sorted(rng.sample(LANGS, rng.choice([1, 1, 2, 3]))):
                translations[lang] = {
                    "name": self.name_of(template, city, p, q, lang),
                    "content": {"shortSummary": SUMMARY_TR[ptype][lang].format(city=city["tr"][lang])},
                }
        locale_urls = {"EN": canonical}
        for lang in translations:
            locale_urls[lang] = f"{SITE_BASE}/{lang.lower()}{url}"

        # Variants.
        variants = self.variants(ptype, kind, template)

        reviews_new = rng.random() < 0.08
        ratings = 0 if reviews_new else int(10 ** rng.uniform(1.2, 4.4))
        rating = 0.0 if reviews_new else round(rng.uniform(3.9, 4.9), 1)
        tags = []
        if ratings > 8000:
            tags.append("Bestseller")
        if reviews_new:
            tags.append("New")
        if all(v["cancellationPolicy"]["cancellable"] and v["cancellationPolicy"]["cancellableUpToInMinutes"]
               for v in variants):
            tags.append("Free cancellation")
        if "skip-the-line" in template["tags"]:
            tags.append("Skip the line")
        if "private" in template["tags"]:
            tags.append("Private")
        if rng.random() < 0.1:
            tags.append("Likely to sell out")

        media = [{"url": f"{IMAGE_BASE}/{city_slug}/{slugify(name)}-{pid}-{n}.jpg", "type": "IMAGE"}
                 for n in range(1, rng.randint(1, 3) + 1)]

        return {
            "id": pid,
            "name": name,
            "productType": ptype,
            "cityCode": city["code"],
            "canonicalUrl": canonical,
            "url": url,
            "neighbourhood": p["hood"] if template["source"] in ("landmarks", "venues") and rng.random() < 0.7 else None,
            "displayTags": tags,
            "content": content,
            "translations": translations,
            "media": media,
            "startLocation": start,
            "endLocation": end,
            "reviewsSummary": {"ratingsCount": ratings, "averageRating": rating},
            "hasInstantConfirmation": rng.random() < 0.85,
            "hasMobileTicket": mobile,
            "primaryCategoryId": primary_cat,
            "secondaryCategoryIds": secondary,
            "primarySubCategoryId": subs[0],
            "subCategoryIds": subs,
            "primaryCollectionId": primary_collection,
            "collectionIds": collection_ids,
            "localeSpecificUrls": locale_urls,
            "inventorySelectionType": "NORMAL",
            "variants": variants,
        }

    # -- variants -----------------------------------------------------------------------------

    def variants(self, ptype, kind, template):
        rng = self.rng
        pool_key = "SHUTTLE" if template["shuttle"] else ptype
        pool = VARIANTS[pool_key]
        n = self.weighted([(1, 30), (2, 45), (3, 25)])
        chosen = rng.sample(pool, min(n, len(pool)))
        if "private" in template["tags"] and ptype in ("TOUR",):
            chosen = [pool[4]] + [v for v in chosen if v is not pool[4]][: n - 1]
        lo, hi = ADULT_PRICE["SHUTTLE" if template["shuttle"] else kind]
        base = rng.uniform(lo, hi)
        policy_c = self.weighted(CANCELLATION)
        policy_r = self.weighted(RESCHEDULE)
        out = []
        for vname, mult, vtags, opts in chosen:
            vid = str(self.next_variant)
            self.next_variant += 1
            price = base * mult * rng.uniform(0.97, 1.03)
            groups_sizes = opts.get("group")
            small = (opts.get("small", False) and rng.random() < 0.5) or rng.random() < 0.02
            if groups_sizes:
                profile = "PER_GROUP"
                groups = []
                for gi, size in enumerate(groups_sizes):
                    factor = 1.0 if gi == 0 else rng.uniform(1.35, 1.6)
                    pr, orig, net = self.price_triple(price * factor)
                    groups.append({"size": size, "name": f"Up to {size} people" if ptype in ("TOUR", "ACTIVITY")
                                   else f"Up to {size} passengers",
                                   "price": pr, "originalPrice": orig, "netPrice": net})
                persons = []
                pax = {"min": 1, "max": max(groups_sizes)}
            else:
                profile = "PER_PERSON"
                groups = []
                pr, orig, net = self.price_triple(price)
                persons = [{"type": "ADULT", "name": "Adult (18+)", "price": pr, "originalPrice": orig,
                            "netPrice": net}]
                if "adults-only" not in template["tags"] and rng.random() < 0.65:
                    pr, orig, net = self.price_triple(price * rng.uniform(0.5, 0.75))
                    persons.append({"type": "CHILD", "name": "Child (6-17)", "price": pr, "originalPrice": orig,
                                    "netPrice": net})
                if rng.random() < 0.2:
                    pr, orig, net = self.price_triple(price * rng.uniform(0.8, 0.9))
                    persons.append({"type": "SENIOR", "name": "Senior (65+)", "price": pr, "originalPrice": orig,
                                    "netPrice": net})
                mn, mx = opts.get("pax") or rng.choice([(1, 10), (1, 10), (1, 4), (2, 15), (1, 8), (1, 20)])
                pax = {"min": mn, "max": mx}

            fields = [FULL_NAME, EMAIL]
            if rng.random() < (0.8 if ptype in ("TRANSFER", "AIRPORT_TRANSFER") else 0.3):
                fields.append(PHONE)
            if ptype == "AIRPORT_TRANSFER":
                fields.append(FLIGHT)
            if ptype == "ACTIVITY" and rng.random() < 0.4:
                fields += [AGE, LANGUAGE]
            input_fields = [dict(f, oldId=i) for i, f in enumerate(fields, start=1)]

            c, r = policy_c, policy_r
            if rng.random() < 0.25:
                c = self.weighted(CANCELLATION)
            if rng.random() < 0.25:
                r = self.weighted(RESCHEDULE)

            flexible = rng.random() < (0.6 if ptype == "ADD_ON" else 0.12)
            variant = {
                "id": vid,
                "name": vname,
                "description": f"{vname}. Please arrive 15 minutes before the start time.",
                "duration": rng.choice(DURATIONS[kind if kind in DURATIONS else ptype]),
                "inventoryType": "FIXED_START_FLEXIBLE_DURATION" if flexible else "FIXED_START_FIXED_DURATION",
                "pax": pax,
                "ticketDeliveryInfoHtml": "<p>Show the QR code on your phone at the entrance.</p>"
                if rng.random() < 0.2 else None,
                "tags": sorted(set(vtags + template["tags"])),
                "inputFields": input_fields,
                "profileType": profile,
                "persons": persons,
                "groups": groups,
                "cancellationPolicy": {"cancellable": c[0], "cancellableUpToInMinutes": c[1]},
                "reschedulePolicy": {"reschedulable": r[0], "reschedulableUpToInMinutes": r[1]},
            }
            if rng.random() < 0.2:
                variant["cashback"] = rng.choice([{"value": 5, "type": "PERCENTAGE"},
                                                  {"value": 10, "type": "PERCENTAGE"},
                                                  {"value": 2.5, "type": "ABSOLUTE"}])
            if ptype == "EVENT":
                self.event_inventory(variant, template, small)
            else:
                variant["schedule"] = self.schedule(kind, small)
            out.append(variant)
        return out

    def schedule(self, kind, small):
        rng = self.rng
        times = START_TIMES[kind if kind in START_TIMES else "TOUR"]
        s = {
            "startTimes": sorted(rng.sample(times, rng.randint(1, min(4, len(times))))),
            "daysAhead": rng.randint(60, 120),
            "capacity": rng.randint(2, 4) if small else rng.randint(5, 40),
        }
        if rng.random() < 0.3:
            s["weekdays"] = sorted(rng.sample(range(1, 8), rng.randint(3, 6)))
        return s

    def event_slots(self, times, capacity, per_month=(1, 2)):
        rng = self.rng
        starts = set()
        for y, m in EVENT_MONTHS:
            for day in rng.sample(range(1, DAYS_IN[(y, m)] + 1), rng.randint(*per_month)):
                t = rng.choice(times)
                starts.add(f"{y:04d}-{m:02d}-{day:02d}T{t}:00")
        return [{"startDateTime": s, "capacity": capacity} for s in sorted(starts)]

    def event_inventory(self, variant, template, small):
        rng = self.rng
        capacity = rng.randint(2, 4) if small else rng.randint(20, 250)
        if "new-years-eve" in template["tags"]:
            variant["slots"] = [{"startDateTime": "2026-12-31T21:00:00", "capacity": capacity},
                                {"startDateTime": "2026-12-31T22:30:00", "capacity": capacity}]
            return
        variant["slots"] = self.event_slots(START_TIMES["EVENT"], capacity)
        if rng.random() < 0.5:  # and a weekly schedule
            s = self.schedule("EVENT", small)
            s["weekdays"] = sorted(rng.sample(range(1, 8), rng.randint(1, 3)))
            variant["schedule"] = s

    # -- the one SEATMAP product ------------------------------------------------------------------

    def seatmap_product(self, city):
        venue = next(v for v in city["venues"] if v["name"] == "Royal Albert Hall")
        template = T("Symphonic film music concert at {lm}",
                     tr4("Concerto sinfonico di colonne sonore alla {lm}",
                         "Concert symphonique de musiques de films au {lm}",
                         "Concierto sinfónico de bandas sonoras en el {lm}",
                         "Sinfonisches Filmmusik-Konzert in der {lm}"),
                     "venues", "concert", "concerts", None, ["classical", "seated"])
        first_variant = self.next_variant
        product = self.product("EVENT", city, template, venue, None)
        self.next_variant = first_variant  # the generic variants are replaced below
        product["inventorySelectionType"] = "SEATMAP"
        # Deterministic translations for this one, so the seat-map demo also shows languages.
        product["translations"] = {
            lang: {"name": self.name_of(template, city, venue, None, lang),
                   "content": {"shortSummary": SUMMARY_TR["EVENT"][lang].format(city=city["tr"][lang])}}
            for lang in ["DE", "FR", "IT"]
        }
        product["localeSpecificUrls"] = {"EN": product["canonicalUrl"]}
        for lang in product["translations"]:
            product["localeSpecificUrls"][lang] = f"{SITE_BASE}/{lang.lower()}{product['url']}"
        seatmaps = [
            ("Stalls and circle", 1.0, {"sections": [
                {"name": "Stalls", "rows": list("ABCDEFGH"), "seatsPerRow": 12},
                {"name": "Circle", "rows": ["J", "K", "L"], "seatsPerRow": 10}]}, (1, 8)),
            ("Premium front stalls", 1.8, {"sections": [
                {"name": "Front", "rows": ["AA", "BB"], "seatsPerRow": 8}]}, (1, 4)),
            ("Private box (4 seats)", 2.6, {"sections": [
                {"name": "Box", "rows": ["1"], "seatsPerRow": 4}]}, (1, 4)),
        ]
        base = 58.0
        variants = []
        slot_times = None
        for vname, mult, seatmap, (mn, mx) in seatmaps:
            vid = str(self.next_variant)
            self.next_variant += 1
            seats = sum(len(s["rows"]) * s["seatsPerRow"] for s in seatmap["sections"])
            if slot_times is None:
                slot_times = [s["startDateTime"] for s in self.event_slots(["19:30"], 1, per_month=(1, 2))]
            pr, orig, net = self.price_triple(base * mult)
            cpr, corig, cnet = self.price_triple(base * mult * 0.6)
            variants.append({
                "id": vid,
                "name": vname,
                "description": f"{vname}: pick your seats on the seat map.",
                "duration": 150,
                "inventoryType": "FIXED_START_FIXED_DURATION",
                "pax": {"min": mn, "max": mx},
                "ticketDeliveryInfoHtml": "<p>Your seat numbers are printed on the mobile ticket.</p>",
                "tags": ["seated"],
                "inputFields": [dict(f, oldId=i) for i, f in enumerate([FULL_NAME, EMAIL, PHONE], start=1)],
                "profileType": "PER_PERSON",
                "persons": [
                    {"type": "ADULT", "name": "Adult (18+)", "price": pr, "originalPrice": orig, "netPrice": net},
                    {"type": "CHILD", "name": "Child (6-17)", "price": cpr, "originalPrice": corig,
                     "netPrice": cnet},
                ],
                "groups": [],
                "cancellationPolicy": {"cancellable": True, "cancellableUpToInMinutes": 2880},
                "reschedulePolicy": {"reschedulable": True, "reschedulableUpToInMinutes": 1440}
                if vname != "Private box (4 seats)" else {"reschedulable": False, "reschedulableUpToInMinutes": None},
                "slots": [{"startDateTime": t, "capacity": seats} for t in slot_times],
                "seatmap": seatmap,
            })
        product["variants"] = variants
        product["displayTags"] = [t for t in product["displayTags"] if t != "Free cancellation"] + ["Free cancellation"]
        product["hasMobileTicket"] = True
        product["content"]["ticketDeliveryInfoHtml"] = (
            "<p>Your mobile ticket arrives by email right after booking; show it on your phone.</p>")
        return product

    # -- all of it ----------------------------------------------------------------------------

    def catalog(self):
        cities, categories, subcategories, collections = self.taxonomy()
        return {
            "baseCurrency": "EUR",
            "currencies": CURRENCIES,
            "cities": cities,
            "categories": categories,
            "subcategories": subcategories,
            "collections": collections,
            "products": self.products(),
        }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    catalog = Generator().catalog()
    text = json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    products = catalog["products"]
    variants = sum(len(p["variants"]) for p in products)
    print(f"wrote {out}: {len(products)} products, {variants} variants, {len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main()
